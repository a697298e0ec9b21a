"""A real `lmcache server` (from .venv-lmcache) with our native_plugin adapter, for tests."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.lmcache.config import LmcacheChoices, plan_lmcache
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import join_coordinator
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts
from graph_kvcache_mcp.domain.outcomes import Unavailable
from tests.support.engines import RunningEngine, require_in_ci

REPO = Path(__file__).resolve().parents[2]
LMCACHE_BIN = REPO / ".venv-lmcache" / "bin" / "lmcache"
ADAPTER_MODULE = "graph_kvcache_mcp.plugins.lmcache.l2"
ADAPTER_CLASS = "EngineL2Client"
TEST_MODEL = ModelFacts(name="test-model", attention_layers=2, kv_heads=2, head_dim=64)
"""Matches the KV shape the server bench registers: 256-token chunks of 256 KiB."""


def require_lmcache() -> Path:
    """The `lmcache` CLI of .venv-lmcache; skips locally (fails in CI) when it is missing."""
    if not LMCACHE_BIN.exists():
        require_in_ci("the LMCache venv (.venv-lmcache with lmcache 0.5.6)")
    return LMCACHE_BIN


def engine_stats(engine: RunningEngine) -> EngineStats:
    with engine.sync_client() as kv:
        stats = kv.engine_stats()
    assert not isinstance(stats, Unavailable), stats
    return stats


def adapter_json(engine: RunningEngine, **params: Any) -> str:
    """`--l2-adapter` JSON for our client; the token travels in the environment, not here."""
    spec = {
        "type": "native_plugin",
        "module_path": ADAPTER_MODULE,
        "class_name": ADAPTER_CLASS,
        "adapter_params": {"base_url": engine.base_url, **params},
    }
    return json.dumps(spec)


def lmcache_env(engine: RunningEngine) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LMCACHE_TRACK_USAGE="false",
        DO_NOT_TRACK="1",
        LMCACHE_DISABLE_BANNER="1",
        PYTHONHASHSEED="0",
        EPISTEMIC_GRAPH_KVCACHE_TOKEN=engine.token.get_secret_value(),
    )
    env.pop("EPISTEMIC_GRAPH_KVCACHE_URL", None)
    env.pop("EPISTEMIC_GRAPH_KVCACHE_ADDR", None)
    return env


def run_lmcache(
    args: Sequence[str], engine: RunningEngine, *, timeout_s: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(require_lmcache()), *args],
        env=lmcache_env(engine),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def cpu_server_flags() -> list[str]:
    """`lmcache server` flags for test machines: small eager L1, metrics on a free port, and the
    CPU transfer path."""
    return [
        "--no-l1-use-lazy",
        "--prometheus-port",
        str(free_port()),
        "--supported-transfer-mode",
        "auto",
    ]


@dataclass(frozen=True)
class LmcacheServer:
    rpc_url: str
    http_url: str
    log_path: Path

    def post(self, path: str) -> Any:
        request = urllib.request.Request(self.http_url + path, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def running_lmcache_server(
    engine: RunningEngine,
    log_dir: Path,
    *,
    ready_timeout_s: float = 120,
    coordinator_url: str | None = None,
) -> Iterator[LmcacheServer]:
    """The generator's `lmcache server` command (mp_native plan), our adapter pointed at
    `engine`, on free loopback ports with a small L1 (joined to `coordinator_url` when given);
    stopped on exit."""
    binary = require_lmcache()
    port, http_port, prometheus_port = free_port(), free_port(), free_port()
    log_path = log_dir / "lmcache-server.log"
    plan = plan_lmcache(
        TEST_MODEL,
        LmcacheChoices(
            engine_url=engine.base_url,
            lmcache_port=port,
            lmcache_http_port=http_port,
            l1_size_gb=0.1,
            num_workers=2,
        ),
    )
    assert plan.lmcache_server is not None
    spec = plan.lmcache_server
    if coordinator_url is not None:
        spec = join_coordinator(spec, coordinator_url)
    command = [
        str(binary),
        *spec.argv[1:],
        # test-only: metrics on a free port, small eager L1, and the CPU transfer path
        "--prometheus-port",
        str(prometheus_port),
        "--no-l1-use-lazy",
        "--supported-transfer-mode",
        "auto",
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, env=lmcache_env(engine), stdout=log, stderr=subprocess.STDOUT
        )
    server = LmcacheServer(f"tcp://127.0.0.1:{port}", f"http://127.0.0.1:{http_port}", log_path)
    try:
        _wait_healthy(server, process, ready_timeout_s)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_healthy(
    server: LmcacheServer, process: subprocess.Popen[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"lmcache server exited {process.returncode}:\n{server.log()}")
        try:
            with urllib.request.urlopen(server.http_url + "/healthcheck", timeout=1) as response:
                if json.loads(response.read()).get("status") == "healthy":
                    return
        except OSError:
            pass
        time.sleep(0.25)  # polling a condition under a deadline, not synchronizing by sleep
    raise AssertionError(f"lmcache server not healthy within {timeout_s} s:\n{server.log()}")
