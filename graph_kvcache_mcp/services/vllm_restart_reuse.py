"""`vllm restart-reuse`: does KV survive a vLLM restart through the engine? Measured, not assumed.

On a managed vLLM started with `--kv-connector engine`: send a long prompt with a fresh nonce
(cold: nothing anywhere has it), wait until the engine stops growing (the connector uploads in the
background), restart vLLM, send the same prompt again. Both calls stream, so each has a time to
first token; the restarted one should be served from the engine (external hits), since the new
process's own prefix cache is empty.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target, sync_client_for
from graph_kvcache_mcp.connectors.vllm.access import open_client
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm, Progress
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import VllmProcessError

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient

FILLER = "The quick brown fox jumps over the lazy dog while the river keeps running. "
SAVE_SETTLE_S = 1.0
SAVE_WAIT_S = 60.0


class ReuseCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    ttft_s: float | None = Field(description="Time to first streamed token.")
    latency_s: float
    prompt_tokens: int
    cached_tokens: int | None = Field(description="Prompt tokens vLLM did not compute.")
    external_hit_tokens: int | None = Field(
        description="Of those, loaded by the KV connector (vllm:external_prefix_cache_hits_total "
        "delta); the rest came from vLLM's own prefix cache."
    )
    engine_bytes_read: int | None = Field(
        None,
        description="Engine bytes the connector read for them "
        "(graph_kvcache:engine_kv_loaded_bytes_total delta).",
    )
    note: str | None = Field(None, description="Why a figure is missing, from the call's trace.")


class RestartReuseOut(BaseModel):
    """Cold call, restart, the same call again: what the engine tier saved."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int
    cold: ReuseCall
    restarted: ReuseCall
    ttft_speedup: float | None = Field(description="Cold TTFT / restarted TTFT.")
    restart_s: float = Field(description="Stop plus start until vLLM was healthy again.")
    engine_blocks_stored: int | None = Field(
        None, description="Blocks the cold call added to the engine (memory backend reports it)."
    )
    engine_bytes_stored: int | None = None
    engine_bytes_loaded: int | None = Field(
        None,
        description="Engine bytes the restarted call read, as EngineKVConnector counted them in "
        "vLLM's /metrics.",
    )
    notes: list[str] = Field(default_factory=list)


async def measure_restart_reuse(
    managed: ManagedVllm,
    settings: Settings,
    *,
    prompt_tokens: int,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 600.0,
    progress: Progress | None = None,
) -> RestartReuseOut:
    """Cold call, restart, warm call on the managed vLLM.

    Raises:
        VllmProcessError: no managed vLLM runs, it does not use the engine connector, it does not
            answer, or it does not come back after the restart.
    """
    state = managed.running_state()
    if state is None:
        raise VllmProcessError(
            f"no managed vLLM runs for {managed.data_dir}: start one with vllm_start "
            "kv_connector='engine' first"
        )
    if "EngineKVConnector" not in " ".join(state.process.command):
        raise VllmProcessError(
            "the managed vLLM was started without kv_connector 'engine': a restart would only "
            "lose its prefix cache. Stop it and start it with kv_connector='engine'"
        )
    model = state.served_model_name
    notes: list[str] = []
    kv = sync_client_for(resolve_kv_target(settings), settings)
    try:
        async with open_client(settings, base_url=state.base_url) as client:
            prompt = await _prompt_of(client, model, prompt_tokens)
            before = await anyio.to_thread.run_sync(kv.engine_stats)
            cold = await _call(client, prompt, model)
        after = await anyio.to_thread.run_sync(_settled_stats, kv)
        began = time.monotonic()
        await anyio.to_thread.run_sync(
            lambda: managed.restart(env=env, ready_timeout_s=ready_timeout_s, progress=progress)
        )
        restart_s = time.monotonic() - began
        async with open_client(settings, base_url=state.base_url) as client:
            restarted = await _call(client, prompt, model)
    finally:
        kv.close()
    blocks, stored = _stored(before, after)
    if restarted.external_hit_tokens and restarted.engine_bytes_read is None:
        notes.append(
            "engine bytes loaded are unknown: vLLM's /metrics has no "
            "graph_kvcache:engine_kv_loaded_bytes_total (is vLLM's copy of graph-kvcache-mcp "
            "older than this one?)"
        )
    if not restarted.external_hit_tokens:
        notes.append(
            "the restarted call loaded nothing from the engine: check vllm_logs for "
            "EngineKVConnector warnings (engine unreachable, blocks rejected)"
        )
    speedup = (
        round(cold.ttft_s / restarted.ttft_s, 2)
        if cold.ttft_s is not None and restarted.ttft_s
        else None
    )
    return RestartReuseOut(
        prompt_tokens=cold.prompt_tokens,
        cold=cold,
        restarted=restarted,
        ttft_speedup=speedup,
        restart_s=round(restart_s, 3),
        engine_blocks_stored=blocks,
        engine_bytes_stored=stored,
        engine_bytes_loaded=restarted.engine_bytes_read,
        notes=notes,
    )


async def _prompt_of(client: VllmClient, model: str, tokens: int) -> str:
    """A prompt of about `tokens` tokens that no cache can hold yet (a fresh nonce first)."""
    per_filler = await client.tokenize(FILLER * 8, model=model)
    if isinstance(per_filler, Unavailable):
        raise VllmProcessError(f"vLLM does not answer: {per_filler.reason}")
    repeats = max(1, tokens * 8 // max(1, per_filler))
    return f"Run {uuid.uuid4().hex}. " + FILLER * repeats


async def _call(client: VllmClient, prompt: str, model: str) -> ReuseCall:
    """One streamed call; its trace splits the hit by tier (the client reads /metrics around
    it while vLLM runs a KV connector)."""
    result = await client.complete(prompt, model=model, max_tokens=1, stream=True)
    if isinstance(result, Unavailable):
        raise VllmProcessError(f"vLLM does not answer: {result.reason}")
    trace = result.trace
    return ReuseCall(
        ttft_s=trace.ttft_s,
        latency_s=trace.latency_s,
        prompt_tokens=trace.prompt_tokens,
        cached_tokens=trace.prefix_cache_hit_tokens,
        external_hit_tokens=trace.external_cache_hit_tokens,
        engine_bytes_read=trace.external_bytes_read,
        note=trace.note,
    )


def _settled_stats(kv: SyncKvClient) -> EngineStats | Unavailable:
    """The engine's stats once its block count stops moving (uploads finish after the answer)."""
    deadline = time.monotonic() + SAVE_WAIT_S
    last = kv.engine_stats()
    while time.monotonic() < deadline:
        time.sleep(SAVE_SETTLE_S)  # the uploads have no completion signal outside vLLM
        now = kv.engine_stats()
        if not isinstance(now, EngineStats) or not isinstance(last, EngineStats):
            return now
        if now.unique_blocks == last.unique_blocks and now.put_new == last.put_new:
            return now
        last = now
    return last


def _stored(
    before: EngineStats | Unavailable, after: EngineStats | Unavailable
) -> tuple[int | None, int | None]:
    if not isinstance(before, EngineStats) or not isinstance(after, EngineStats):
        return None, None
    blocks = None
    if before.unique_blocks is not None and after.unique_blocks is not None:
        blocks = after.unique_blocks - before.unique_blocks
    elif before.put_new is not None and after.put_new is not None:
        blocks = after.put_new - before.put_new
    stored = None
    if before.resident_bytes is not None and after.resident_bytes is not None:
        stored = after.resident_bytes - before.resident_bytes
    return blocks, stored
