"""Reading how a managed vLLM was started: one environment variable of a live process, and the
KV connector of a recorded command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from graph_kvcache_mcp.connectors.processes.identity import environment_value
from graph_kvcache_mcp.connectors.stack.runtime import leaked_lmcache_segments
from graph_kvcache_mcp.domain.lmcache.config import mp_kv_transfer_config
from graph_kvcache_mcp.domain.vllm.wiring import wiring_of


def test_one_variable_of_a_live_process_environment_is_read_and_nothing_else() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "7", "SOME_SECRET": "s3cret"}
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        # Popen returns once exec began, before the kernel has laid out the new environment:
        # read it only after the child has run.
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert environment_value(child.pid, "PYTHONHASHSEED") == "7"
        assert environment_value(child.pid, "NOT_SET_ANYWHERE") is None
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)
        assert child.stdout is not None
        child.stdout.close()
    assert environment_value(child.pid, "PYTHONHASHSEED") is None  # gone


def test_the_kv_connector_comes_from_the_recorded_command() -> None:
    config = '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}'
    assert wiring_of(("python", "-m", "x", "--kv-transfer-config", config)).connector == (
        "LMCacheMPConnector"
    )
    assert wiring_of(("python", f"--kv-transfer-config={config}")).connector == "LMCacheMPConnector"
    assert wiring_of(("python", "-m", "x", "--port", "8000")).connector is None


def test_the_mp_connectors_server_address_is_read_from_the_recorded_command() -> None:
    transfer = mp_kv_transfer_config("127.0.0.1", 5601)
    command = ("python", "-m", "vllm", "--kv-transfer-config", json.dumps(transfer))
    assert wiring_of(command).lmcache_target == "127.0.0.1:5601"
    assert wiring_of(command).connector == "LMCacheMPConnector"
    assert wiring_of(("python", "-m", "vllm")).lmcache_target is None


def test_a_private_rpc_socket_is_the_mp_connectors_target_and_the_port_still_names_the_server() -> (
    None
):
    transfer = mp_kv_transfer_config("127.0.0.1", 5601, "ipc:///data/lmcache/rpc-5601.sock")
    command = ("python", "-m", "vllm", "--kv-transfer-config", json.dumps(transfer))
    assert wiring_of(command).lmcache_target == "ipc:///data/lmcache/rpc-5601.sock"
    assert wiring_of(command).lmcache_port == 5601


def test_only_segments_whose_process_is_gone_count_as_leaked(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_pid = int(gone.stdout)
    for name in (f"lmcache_kv_{dead_pid}_0", f"lmcache_kv_{os.getpid()}_0", "lmcache_l1_pool_x"):
        (tmp_path / name).write_bytes(b"")
    assert leaked_lmcache_segments(tmp_path) == [f"lmcache_kv_{dead_pid}_0"]
