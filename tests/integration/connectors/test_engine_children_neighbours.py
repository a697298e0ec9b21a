"""The engine token inside the children we start (the `lmcache server`'s L2 adapter, vLLM's
`EngineKVConnector`) against a second local user (`nobody`) who takes the engine's port once the
engine is gone, staged for real: a managed engine, our L2 adapter and the store under it built
from the environment a child is given, and a squatter running as `nobody`."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.children.proof import ENGINE_DIR_VARIABLE
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.opener import engine_environment, resolve_kv_target
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.processes.ports import wait_port_free
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError
from graph_kvcache_mcp.plugins.lmcache.l2 import EngineL2Client, wait_for_completion
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from graph_kvcache_mcp.services.stack.stack import Stack
from tests.support.engines import require_in_ci
from tests.support.neighbour import (
    SYSTEM_PYTHON,
    can_run_as_nobody,
    squat_now,
    squatter_received,
)

PAGE = bytes(range(256)) * 1024  # 256 KiB, as a KV page


@pytest.fixture
def managed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ManagedEngine]:
    """A managed engine, and this process's environment as the stack gives it to a child."""
    if not can_run_as_nobody():
        require_in_ci("root with setpriv and /usr/bin/python3 (a second local user)")
    tmp_path.chmod(0o755)  # the squatter, as nobody, reads nothing of ours but needs no more
    engine = ManagedEngine(tmp_path)
    engine.start(backend="memory")
    try:
        settings = Settings.build(data_dir=tmp_path)
        child_env = engine_environment(resolve_kv_target(settings), settings)
        assert child_env[ENGINE_DIR_VARIABLE] == str(tmp_path)
        for name, value in child_env.items():
            monkeypatch.setenv(name, value)
        yield engine
    finally:
        engine.stop(term_wait_s=5.0)


def _kill(engine: ManagedEngine) -> int:
    """SIGKILL the engine (an unclean stop: its record stays); its port once it is free."""
    state = engine.running_state()
    assert state is not None
    os.kill(state.process.pid, signal.SIGKILL)
    assert wait_port_free("127.0.0.1", state.port, 10.0)
    return state.port


def _batch(client: EngineL2Client, keys: list[str]) -> tuple[bool, str]:
    done = wait_for_completion(client, client.submit_batch_set(keys, [PAGE] * len(keys)))
    assert done is not None
    return done[1], done[2]


def test_a_squatter_on_a_dead_engines_port_gets_no_token_and_the_next_engine_has_a_new_one(
    managed: ManagedEngine,
) -> None:
    old_token = managed.existing_token()
    assert old_token is not None
    l2 = EngineL2Client()
    store = EngineBlockStore.from_environment(os.environ)
    try:
        assert _batch(l2, ["model@1@0@aa"]) == (True, "")
        port = _kill(managed)
        squatter = squat_now(port)
        try:
            ok, error = _batch(l2, ["model@1@0@bb", "model@1@0@cc"])
            assert not ok and "no managed engine runs" in error, error
            assert store.fetch(["plain-key"]) == [None]
            assert store.count_present(["plain-key"]) == 0
        finally:
            received = squatter_received(squatter)
        # Not one byte: no token, no page (a connection the proof closed unsent at most).
        assert all(data == b"" for data in received), received

        # The next engine (the old port is the squatter's: a new one) gets a new token, and the
        # children follow it without a restart.
        managed.start(backend="memory")
        new_token = managed.existing_token()
        assert new_token is not None and new_token != old_token
        deadline = time.monotonic() + 30
        while (outcome := _batch(l2, ["model@1@0@dd"])) != (True, "") and time.monotonic() < (
            deadline
        ):
            time.sleep(0.2)  # a refusal is held for a moment before the engine is proved again
        assert outcome == (True, "")
        state = managed.running_state()
        assert state is not None and state.port != port
        with SyncKvClient(state.base_url, old_token, timeout_s=5.0) as stale:
            refused = stale.engine_stats()
        assert isinstance(refused, Unavailable) and refused.status == 401
    finally:
        l2.close()
        store.close(flush_timeout_s=1.0)


def test_engine_stop_refuses_while_a_child_of_ours_uses_it_naming_it(
    managed: ManagedEngine, tmp_path: Path
) -> None:
    # A child as the stack starts one: the environment `engine_environment` gives it.
    child = subprocess.Popen([SYSTEM_PYTHON, "-c", "import time; time.sleep(60)"], env=os.environ)
    try:
        with pytest.raises(EngineProcessError, match=f"pid {child.pid}"):
            Stack.of(Settings.build(data_dir=tmp_path)).stop_engine(wait_s=5.0)
        assert managed.running_state() is not None
    finally:
        child.kill()
        child.wait()
    assert Stack.of(Settings.build(data_dir=tmp_path)).stop_engine(wait_s=5.0).stopped
