"""`graph-kvcache-mcp demo --vllm`: the KV walk-through, then the golden path on a real CPU vLLM
(tiny local model, bundle, two chats whose second turn hits vLLM's prefix cache, diagnosis),
and nothing it started is left running."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from tests.support.processes import clean_env, running_engine_state, venv_script
from tests.support.vllm import VllmServers, require_vllm_venv

DEMO_TIMEOUT_S = 1200  # a generous bound: a CPU vLLM start is 1-3 minutes here under load


@pytest.mark.vllm
def test_demo_with_vllm_walks_the_golden_path_and_stops_what_it_started(
    vllm_private: VllmServers, tmp_path: Path
) -> None:
    python = require_vllm_venv()
    vllm_private.stop_shared()  # one vLLM at a time on this machine
    done = subprocess.run(
        [str(venv_script("graph-kvcache-mcp")), "demo", "--vllm", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        env=clean_env(GRAPH_KVCACHE_VLLM_PYTHON=str(python)),
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for step in ("9. diagnose_stack", "10. vllm_start", "11. bundle_compile", "12. bundle_chat"):
        assert step in out
    assert "13. bundle_chat" in out and "14. diagnose_stack" in out
    assert "15. vllm_stop -> stopped" in out
    assert "vLLM healthy on port" in out
    second_turn = out.split("13. bundle_chat", 1)[1].splitlines()[1]
    assert "from vLLM's prefix cache" in second_turn and " 0 from" not in second_turn
    assert "done: every step answered as expected" in out
    assert ManagedVllm(tmp_path, python=python).running_state() is None
    assert running_engine_state(tmp_path) is None


def test_demo_with_vllm_but_no_vllm_python_says_how_to_get_one(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(venv_script("graph-kvcache-mcp")), "demo", "--vllm", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(GRAPH_KVCACHE_VLLM_PYTHON=str(tmp_path / "missing" / "python")),
    )
    assert done.returncode == 3
    assert "./run.sh demo --vllm" in done.stdout and "Traceback" not in done.stderr
