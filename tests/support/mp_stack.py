"""The design's own stack for tests: a real engine, a real `lmcache server` (our native_plugin
adapter as L2) and a real CPU vLLM with LMCache's MP connector, started by the project's own stack
start (`services/stack/start.py`) from `.venv-vllm`, which holds vLLM and LMCache together.

`MpStack.ensure()` brings every piece up that is not running (a test that stopped one leaves the
next test a stack to start from); `close()` stops vLLM first, then the server, then the engine.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters, parse_lmcache_counters
from graph_kvcache_mcp.domain.lmcache.stack import StackOptions
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot, parse_snapshot
from graph_kvcache_mcp.services.stack.lifetime import RunsUntilStop
from graph_kvcache_mcp.services.stack.start import start_vllm
from tests.support.vllm import (
    MODEL_NAME,
    READY_TIMEOUT_S,
    VLLM_CPU,
    VLLM_PYTHON,
    fast_cpu_launch,
    offline_environment,
    require_vllm_venv,
    tiny_model_dir,
)
from tests.support.vllm_bench import bench_serve

CHUNK_SIZE = 256  # the stack's default: a tool start must plan the same server to reuse it
STACK_KV_BYTES = 8 * 1024 * 1024
"""vLLM's own KV memory: 8,192 tokens of the tiny model (1 KiB each), so a few long prompts
evict a prompt from vLLM's prefix cache while LMCache keeps it."""
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 64 * 2  # layers x (K, V) x KV heads x head size x bf16
KV_TOKENS = STACK_KV_BYTES // KV_BYTES_PER_TOKEN


def require_lmcache_in_vllm_venv() -> Path:
    """vLLM's venv with LMCache in it (./run.sh test installs both); skip/fail as usual."""
    python = require_vllm_venv()
    if not (python.parent / "lmcache").exists():
        from tests.support.engines import require_in_ci

        require_in_ci("lmcache in .venv-vllm (./run.sh test installs it)")
    return python


@dataclass
class MpStack:
    """One data dir's engine, lmcache server and vLLM, on fixed free loopback ports."""

    root: Path
    engine_port: int = field(default_factory=free_port)
    vllm_port: int = field(default_factory=free_port)
    lmcache_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.data_dir = self.root / "data"
        self.engine = ManagedEngine(self.root / "engine")
        self.vllm = ManagedVllm(self.data_dir, python=VLLM_PYTHON)
        self.lmcache = ManagedLmcache(self.data_dir, python=VLLM_PYTHON)
        self.env = offline_environment(self.root / "vllm-cache")

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    @property
    def settings(self) -> Settings:
        return Settings.build(
            kv_url=self.engine_url,
            kv_token=self.engine.token(),
            data_dir=self.data_dir,
            vllm_python=VLLM_PYTHON,
            vllm_base_url=f"http://127.0.0.1:{self.vllm_port}/v1",
            vllm_model=MODEL_NAME,
            lmcache_port=self.lmcache_port,
            lmcache_http_port=self.http_port,
            toolsets=("kv", "vllm", "lmcache"),
        )

    @property
    def shm_name(self) -> str:
        return f"graphkv_{self.lmcache_port}"

    def launch(self, *, port: int | None = None) -> VllmLaunch:
        """The stack's vLLM (or one more on `port`) with the MP connector to its server."""
        return fast_cpu_launch(
            tiny_model_dir(),
            port or self.vllm_port,
            kv_connector="mp_native",
            lmcache_port=self.lmcache_port,
            kv_cache_memory_bytes=STACK_KV_BYTES,
        )

    @property
    def options(self) -> StackOptions:
        return StackOptions(http_port=self.http_port)

    async def ensure(self) -> None:
        """Engine, server and vLLM up (each reused when it already runs)."""
        self.engine.start(backend="durable", port=self.engine_port)

        os.environ.update(self.env)  # vLLM inherits HF_*/VLLM_* from this process
        await start_vllm(  # the configured engine, started above; the server until stop
            self.settings,
            self.launch(),
            RunsUntilStop(),
            managed=self.vllm,
            options=self.options,
            ready_timeout_s=READY_TIMEOUT_S,
            calls_base_url=self.settings.vllm_base_url,
            platform=VLLM_CPU,
        )

    def close(self) -> None:
        self.vllm.stop(term_wait_s=10.0)
        self.lmcache.stop(term_wait_s=10.0)
        self.engine.stop(term_wait_s=5.0)

    # --- what the test scrapes itself ---------------------------------------------------------

    def vllm_root(self, port: int | None = None) -> str:
        return f"http://127.0.0.1:{port or self.vllm_port}"

    def vllm_counters(self, port: int | None = None) -> MetricsSnapshot:
        text = httpx.get(f"{self.vllm_root(port)}/metrics", timeout=30.0).text
        return parse_snapshot(text, MODEL_NAME)

    def lmcache_counters(self) -> LmcacheCounters:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.http_port}/metrics", timeout=10
        ) as reply:
            return parse_lmcache_counters(reply.read().decode())

    def engine_stats(self) -> EngineStats:
        from graph_kvcache_mcp.connectors.engine.client import SyncKvClient

        with SyncKvClient(self.engine_url, self.engine.token()) as kv:
            stats = kv.engine_stats()
        assert not isinstance(stats, Unavailable), stats
        return stats

    def complete(
        self, token_ids: list[int], *, port: int | None = None, max_tokens: int = 6
    ) -> dict[str, Any]:
        """Greedy completion of a token-id prompt with logprobs; the raw answer."""
        response = httpx.post(
            f"{self.vllm_root(port)}/v1/completions",
            json={
                "model": MODEL_NAME,
                "prompt": token_ids,
                "max_tokens": max_tokens,
                "temperature": 0,
                "logprobs": 3,
            },
            timeout=180.0,
        )
        response.raise_for_status()
        return dict(response.json())

    def bench(self, out_dir: Path, **options: Any) -> dict[str, Any]:
        """vLLM's own benchmark client (`bench_serve`, its prefix_repetition options) against
        this stack's vLLM; vLLM's result."""
        return bench_serve(
            VLLM_PYTHON,
            self.vllm_root(),
            model=MODEL_NAME,
            tokenizer=tiny_model_dir(),
            out_dir=out_dir,
            env={**os.environ, **self.env},
            **options,
        )

    def healthy(self) -> bool:
        return httpx.get(f"{self.vllm_root()}/health", timeout=30.0).status_code == 200

    def lmcache_log(self) -> str:
        return self.lmcache.log_path.read_text(errors="replace")


def module_stack(root: Path) -> Iterator[MpStack]:
    """A module's stack under `root`, closed (and the environment `ensure` changed restored) at
    the end: the body of a module-scoped fixture."""
    require_lmcache_in_vllm_venv()
    stack = MpStack(root)
    saved = dict(os.environ)
    try:
        yield stack
    finally:
        stack.close()
        os.environ.clear()
        os.environ.update(saved)


def logprobs_of(answer: dict[str, Any]) -> list[float]:
    return [float(value) for value in answer["choices"][0]["logprobs"]["token_logprobs"]]


def cached_tokens_of(answer: dict[str, Any]) -> int:
    details = answer["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def shm_entries(name: str, vllm_pids: list[int]) -> list[str]:
    """What /dev/shm holds of the server named `name`, and any segment LMCache leaked for one of
    our vLLM processes (`lmcache_kv_<pid>_<n>`)."""
    leaked = tuple(f"lmcache_kv_{pid}_" for pid in vllm_pids)
    return sorted(
        entry
        for entry in os.listdir("/dev/shm")
        if entry == f"lmcache_l1_pool_{name}" or (leaked and entry.startswith(leaked))
    )


def dumps(value: object) -> str:
    return json.dumps(value, default=str)[:2000]
