"""The managed vLLM's lifecycle guarantees against the real server: one server for two
concurrent starts, a private data dir, and no secret of ours in its environment."""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmStatus
from tests.support.processes import SECRETS, environ_of, modes_under, wider_than_private
from tests.support.vllm import (
    READY_TIMEOUT_S,
    VLLM_CPU,
    VllmServers,
    fast_cpu_launch,
    offline_environment,
    require_vllm_venv,
    tiny_model_dir,
)


@pytest.mark.vllm
def test_two_concurrent_starts_give_one_private_server_without_our_secrets(
    vllm_private: VllmServers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm_private.stop_shared()  # one vLLM at a time on a small machine
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("VLLM_API_KEY")  # set for vLLM it would pass on purpose: tested below
    python = require_vllm_venv()
    data_dir = tmp_path / "data"
    launch = fast_cpu_launch(tiny_model_dir(), free_port())
    managers = [ManagedVllm(data_dir, python=python), ManagedVllm(data_dir, python=python)]
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache_root:
        env = offline_environment(Path(cache_root))

        def start(managed: ManagedVllm) -> VllmStatus:
            return managed.start(
                launch, env=env, ready_timeout_s=READY_TIMEOUT_S, platform=VLLM_CPU
            )

        try:
            with ThreadPoolExecutor(2) as pool:
                statuses = list(pool.map(start, managers))
            assert statuses[0].pid is not None
            environ = environ_of(statuses[0].pid)
            modes = modes_under(data_dir)
        finally:
            stopped = managers[0].stop(term_wait_s=10.0)
    assert statuses[0].pid == statuses[1].pid and stopped.pid == statuses[0].pid
    assert sorted(status.reused for status in statuses) == [False, True]
    assert not set(SECRETS.values()) & set(environ.values())
    assert environ.get("HF_HUB_OFFLINE") == "1"  # what the caller set for it does pass
    assert {"vllm/vllm.log", "vllm/state.json", "vllm/lifecycle.lock"} <= set(modes)
    assert wider_than_private(modes, data_dir) == {}
