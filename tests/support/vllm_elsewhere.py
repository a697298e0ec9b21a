"""A real vLLM that no data dir of ours started: the tiny model served on another loopback
address (127.0.0.2), started here as a user would start their own, with a port that is free on
127.0.0.1 too. What the project must treat as a configured target, never as its own.

It publishes KV events on ipc sockets in the test's directory, so the fleet view can follow it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx2

from graph_kvcache_mcp.connectors.files.hf_config import local_model_config
from graph_kvcache_mcp.connectors.vllm.host import child_environment
from graph_kvcache_mcp.domain.vllm.entry import ENTRY_MODULE
from graph_kvcache_mcp.domain.vllm.launch import plan_launch
from tests.support.vllm import (
    READY_TIMEOUT_S,
    VLLM_CPU,
    fast_cpu_launch,
    offline_environment,
    require_vllm_venv,
    tiny_model_dir,
)

ELSEWHERE_HOST = "127.0.0.2"


@dataclass(frozen=True)
class ElsewhereVllm:
    host: str
    port: int
    kv_events: str
    kv_events_replay: str
    pid: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def port_free_on_both(host: str) -> int:
    """A port nothing listens on at `host` nor at 127.0.0.1 (where a wrong probe would look)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port: int = probe.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as loopback:
            try:
                loopback.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no port free on both {host} and 127.0.0.1")


@contextmanager
def vllm_elsewhere(work_dir: Path, host: str = ELSEWHERE_HOST) -> Iterator[ElsewhereVllm]:
    """Start vLLM on `host` as its own process group, and stop that group after the block."""
    python = require_vllm_venv()
    model_dir = tiny_model_dir()
    port = port_free_on_both(host)
    feed, replay = f"ipc://{work_dir / 'feed.sock'}", f"ipc://{work_dir / 'replay.sock'}"
    launch = fast_cpu_launch(
        model_dir,
        port,
        kv_events=True,
        kv_events_endpoint=feed,
        kv_events_replay_endpoint=replay,
    )
    plan = plan_launch(launch, VLLM_CPU, host=host, model_config=local_model_config(str(model_dir)))
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache_root:
        env = child_environment(launch, {**plan.env, **offline_environment(Path(cache_root))})
        log_path = work_dir / "vllm-elsewhere.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(python), "-m", ENTRY_MODULE, *plan.args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_healthy(f"http://{host}:{port}", process, log_path)
            yield ElsewhereVllm(host, port, feed, replay, process.pid)
        finally:
            _stop_group(process)


def _wait_healthy(root: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S  # a bound, not a race: the box is shared
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise AssertionError(f"vLLM on {root} exited with {process.returncode}: {tail}")
        try:
            if httpx2.get(root + "/health", timeout=2.0).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"vLLM on {root} was not healthy within {READY_TIMEOUT_S:g} s")


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the group this fixture started (its own session), SIGKILL if it lingers."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        return
    with suppress(ProcessLookupError):  # what of the group outlived its leader (engine core)
        os.killpg(process.pid, signal.SIGKILL)
