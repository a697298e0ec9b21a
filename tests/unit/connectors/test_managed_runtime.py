"""Reading how a managed vLLM was started: one environment variable of a live process, and the
KV connector of a recorded command."""

from __future__ import annotations

import os
import subprocess
import sys

from graph_kvcache_mcp.connectors.processes.identity import environment_value
from graph_kvcache_mcp.connectors.stack.runtime import kv_connector_of


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
    assert kv_connector_of(("python", "-m", "x", "--kv-transfer-config", config)) == (
        "LMCacheMPConnector"
    )
    assert kv_connector_of(("python", f"--kv-transfer-config={config}")) == "LMCacheMPConnector"
    assert kv_connector_of(("python", "-m", "x", "--port", "8000")) is None
