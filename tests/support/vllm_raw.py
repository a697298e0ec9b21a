"""A real vLLM started with flags the managed launcher refuses on purpose (e.g.
`--no-enable-prefix-caching`), so diagnoses can be tested against a misconfigured server.

Same tiny model, venv and offline environment as `tests/support/vllm.py`; the process group is
ours (a new session) and is terminated on exit. Take the `vllm_private` fixture and call
`stop_shared()` first: only one vLLM fits beside the others.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ENTRY_MODULE
from tests.support.vllm import (
    BLOCK_SIZE,
    MODEL_NAME,
    READY_TIMEOUT_S,
    offline_environment,
    require_vllm_venv,
    tiny_model_dir,
)


@contextmanager
def raw_vllm(
    log_dir: Path,
    *flags: str,
    max_model_len: int = 4096,
    kv_cache_memory_bytes: int = 256 * 1024 * 1024,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> Iterator[str]:
    """Serve the tiny model on `host` with exactly `flags` added (no prefix-caching flag of our
    own); yields the OpenAI base URL."""
    python = require_vllm_venv()
    model_dir = tiny_model_dir()
    port = port or free_port(host)
    command = [
        str(python), "-m", ENTRY_MODULE,
        "--model", str(model_dir), "--served-model-name", MODEL_NAME,
        "--host", host, "--port", str(port), "--dtype", "bfloat16",
        "--max-model-len", str(max_model_len), "--block-size", str(BLOCK_SIZE),
        "--kv-cache-memory-bytes", str(kv_cache_memory_bytes), "--enforce-eager",
        *flags,
    ]  # fmt: skip
    log_path = log_dir / "vllm-raw.log"
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache_root:
        env = {
            **{k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"},
            **offline_environment(Path(cache_root)),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_HOST_IP": "127.0.0.1",
        }
        with log_path.open("w") as log:
            process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            _wait_healthy(f"http://{host}:{port}", process, log_path)
            yield f"http://{host}:{port}/v1"
        finally:
            os.killpg(process.pid, signal.SIGTERM)  # our own new session: vLLM and its workers
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def _wait_healthy(root: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"vLLM exited {process.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(root + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # polling a condition under a deadline, not synchronizing by sleep
    raise AssertionError(f"vLLM not healthy within {READY_TIMEOUT_S} s:\n{log_path.read_text()}")
