"""Real CPU vLLM servers running `EngineKVConnector` against a real engine, for tests and benches.

The server runs our connector from this checkout (`PYTHONPATH`), talks to the engine named in its
environment, and is started and stopped by the project's own lifecycle code (`ManagedVllm`).
Prompts are sent as token ids (`/v1/completions` accepts them), so a test knows every block's key.
"""

from __future__ import annotations

import random
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import engine_environment, resolve_kv_target
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmStatus
from graph_kvcache_mcp.domain.vllm.kv_blocks import block_keys
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.domain.vllm.metrics import parse_snapshot
from tests.support.engines import RunningEngine
from tests.support.vllm import (
    MODEL_NAME,
    READY_TIMEOUT_S,
    REPO,
    VLLM_CPU,
    fast_cpu_launch,
    offline_environment,
    require_vllm_venv,
    tiny_model_dir,
)

_IDENTITY_LINE = re.compile(r"EngineKVConnector \(scheduler\) ready: .* identity ([0-9a-f]{64})")


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    cached_tokens: int
    elapsed_s: float
    logprobs: list[float]


def complete(
    root_url: str, token_ids: Sequence[int], *, max_tokens: int = 4, ignore_eos: bool = False
) -> Completion:
    """Greedy completion of a token-id prompt; `cached_tokens` as vLLM reports it, and each
    generated token's logprob (so restored KV can be compared with a cold run). `ignore_eos`:
    exactly `max_tokens` tokens, for decode-rate benchmarks."""
    began = time.perf_counter()
    response = httpx.post(
        f"{root_url}/v1/completions",
        json={
            "model": MODEL_NAME,
            "prompt": list(token_ids),
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": 1,
            **({"ignore_eos": True} if ignore_eos else {}),
        },
        timeout=300.0,
    )
    elapsed = time.perf_counter() - began
    response.raise_for_status()
    body = response.json()
    usage = body["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return Completion(
        text=body["choices"][0]["text"],
        prompt_tokens=int(usage["prompt_tokens"]),
        cached_tokens=int(details.get("cached_tokens") or 0),
        elapsed_s=elapsed,
        logprobs=[float(x) for x in body["choices"][0]["logprobs"]["token_logprobs"]],
    )


def ttfts(server: Completer, prompts: Sequence[Sequence[int]]) -> tuple[list[float], list[int]]:
    """One-token completions of `prompts`: each one's latency (its TTFT) and cached tokens."""
    times, cached = [], []
    for prompt in prompts:
        answer = server.complete(prompt, max_tokens=1)
        times.append(answer.elapsed_s)
        cached.append(answer.cached_tokens)
    return times, cached


class Completer(Protocol):
    def complete(self, token_ids: Sequence[int], *, max_tokens: int = 4) -> Completion: ...


@dataclass(frozen=True)
class ConnectorVllm:
    """A live vLLM whose KV tier is the engine."""

    managed: ManagedVllm
    status: VllmStatus
    block_size: int

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.status.port}"

    def complete(
        self, token_ids: Sequence[int], *, max_tokens: int = 4, ignore_eos: bool = False
    ) -> Completion:
        """Greedy completion of a token-id prompt (see `complete`)."""
        return complete(self.root_url, token_ids, max_tokens=max_tokens, ignore_eos=ignore_eos)

    def external_hits(self) -> int:
        """`vllm:external_prefix_cache_hits_total`, in tokens."""
        text = httpx.get(f"{self.root_url}/metrics", timeout=30.0).text
        return parse_snapshot(text, MODEL_NAME).external_prefix_cache_hits_tokens or 0

    def cached_by_source(self) -> dict[str, int]:
        """`vllm:prompt_tokens_cached_by_source_total` by its `source` label, in tokens."""
        text = httpx.get(f"{self.root_url}/metrics", timeout=30.0).text
        return dict(parse_snapshot(text, MODEL_NAME).prompt_tokens_cached_by_source or {})

    def reset_local_cache(self) -> None:
        """Empty vLLM's own prefix cache (dev mode), so the next lookup goes to the engine."""
        httpx.post(f"{self.root_url}/reset_prefix_cache", timeout=30.0).raise_for_status()

    def identity_digest(self) -> str:
        """The model identity the connector logged at start-up (keys are derived from it)."""
        matches = _IDENTITY_LINE.findall(self.managed.log_path.read_text(errors="replace"))
        assert matches, f"no EngineKVConnector start-up line in {self.managed.log_path}"
        return str(matches[-1])

    def keys_of(self, token_ids: Sequence[int]) -> list[str]:
        """The engine keys of the prompt's full blocks."""
        return block_keys(self.identity_digest(), token_ids, self.block_size)

    def log_text(self) -> str:
        return self.managed.log_path.read_text(errors="replace")


def connector_environment(settings: Settings, cache_root: Path) -> dict[str, str]:
    """What `vllm start --kv-connector engine` passes, plus this checkout on vLLM's path."""
    env = offline_environment(cache_root)
    env["PYTHONPATH"] = str(REPO)  # this checkout's connector, not whatever vLLM's venv has
    env.update(engine_environment(resolve_kv_target(settings), settings))
    return env


@contextmanager
def connector_vllm(
    data_dir: Path,
    engine: RunningEngine,
    *,
    model_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    **launch_overrides: object,
) -> Iterator[ConnectorVllm]:
    """A vLLM with `EngineKVConnector` on `engine`, stopped when the block exits.

    `extra_env` goes into vLLM's environment last (benchmarks use it, e.g. `VLLM_PLUGINS`)."""
    managed = ManagedVllm(data_dir, python=require_vllm_venv())
    values: dict[str, object] = {"kv_connector": "engine"}
    values.update(launch_overrides)
    launch = fast_cpu_launch(model_dir or tiny_model_dir(), free_port(), **values)
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache_root:
        env = {**connector_environment(engine.settings, Path(cache_root)), **(extra_env or {})}
        try:
            status = managed.start(
                launch, env=env, ready_timeout_s=READY_TIMEOUT_S, platform=VLLM_CPU
            )
            yield ConnectorVllm(managed, status, launch.block_size or 32)
        finally:
            managed.stop(term_wait_s=10.0)


@contextmanager
def connector_vllms(
    data_dirs: Sequence[Path], engine: RunningEngine, **launch_overrides: object
) -> Iterator[list[ConnectorVllm]]:
    """Several vLLMs with `EngineKVConnector` on `engine`, started at once (a start mostly waits
    on vLLM's own processes) and all stopped when the block exits."""
    managers = [ManagedVllm(data_dir, python=require_vllm_venv()) for data_dir in data_dirs]
    launches = [
        fast_cpu_launch(tiny_model_dir(), free_port(), kv_connector="engine", **launch_overrides)
        for _ in managers
    ]
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache_root:
        env = connector_environment(engine.settings, Path(cache_root))

        def start(managed: ManagedVllm, launch: VllmLaunch) -> ConnectorVllm:
            status = managed.start(
                launch, env=env, ready_timeout_s=READY_TIMEOUT_S, platform=VLLM_CPU
            )
            return ConnectorVllm(managed, status, launch.block_size or 32)

        try:
            with ThreadPoolExecutor(len(managers)) as pool:
                jobs = [
                    pool.submit(start, m, launch)
                    for m, launch in zip(managers, launches, strict=True)
                ]
                servers = [job.result() for job in jobs]
            yield servers
        finally:
            for managed in managers:
                managed.stop(term_wait_s=10.0)


def random_prompt(length: int, *, seed: int, vocab: int = 4000) -> list[int]:
    """Token ids no earlier prompt shares (ids above the tokenizer's special tokens)."""
    rng = random.Random(seed)
    return [rng.randrange(16, vocab) for _ in range(length)]
