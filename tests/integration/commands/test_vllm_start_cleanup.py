"""A failed `vllm start --kv-connector mp_native` stops what it started (issue #28 item 3).

The start brings up the managed engine and the `lmcache server` (with its /dev/shm L1 pool),
then vLLM, which refuses a model dir whose config.json names no architecture. The processes and
the /dev/shm entries of this test's data dir and ports are listed before and after: none may be
left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from graph_kvcache_mcp.connectors.processes.ports import free_port
from tests.support.mp_stack import require_lmcache_in_vllm_venv
from tests.support.vllm import offline_environment

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]

SHM = Path("/dev/shm")


def _our_processes(root: Path, ports: list[int]) -> list[str]:
    """Running processes whose command line names a path under `root` or one of `ports`."""
    marks = [str(root), *(str(port) for port in ports)]
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or ())
        if any(mark in command for mark in marks) and process.pid != os.getpid():
            found.append(f"{process.pid}: {command[:200]}")
    return found


def _our_shm(lmcache_port: int) -> set[str]:
    """The L1 pool the stack plans for this port (`graphkv_<port>`), and any segment naming it."""
    return {entry.name for entry in SHM.iterdir() if f"graphkv_{lmcache_port}" in entry.name}


def test_a_failed_mp_native_start_leaves_no_process_and_no_shared_memory(tmp_path: Path) -> None:
    vllm_python = require_lmcache_in_vllm_venv()
    model = tmp_path / "not-a-model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # vLLM refuses: no architecture, no model type
    data_dir = tmp_path / "data"
    vllm_port, lmcache_port, http_port = free_port(), free_port(), free_port()
    ports = [vllm_port, lmcache_port, http_port]
    assert (_our_processes(tmp_path, ports), _our_shm(lmcache_port)) == ([], set())
    env = {
        **os.environ,
        **offline_environment(tmp_path / "cache"),
        "GRAPH_KVCACHE_VLLM_PYTHON": str(vllm_python),
    }
    env.pop("EPISTEMIC_GRAPH_KVCACHE_URL", None)  # the managed engine: this start starts it
    command = [sys.executable, "-m", "graph_kvcache_mcp", "vllm", "start"]
    command += ["--kv-connector", "mp_native", "--model", str(model), "--port", str(vllm_port)]
    command += ["--lmcache-port", str(lmcache_port), "--lmcache-http-port", str(http_port)]
    command += ["--ready-timeout-s", "600", "--data-dir", str(data_dir)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 3, done.stderr[-3000:]  # vLLM exited: the start failed
    assert "stopped the lmcache server it started" in done.stderr
    assert "stopped the engine it started" in done.stderr
    assert "Traceback" not in done.stderr
    assert _our_processes(tmp_path, ports) == []
    assert _our_shm(lmcache_port) == set()
