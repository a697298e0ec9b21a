"""`vllm restart-reuse`: does KV survive a restart? Measured, not assumed.

On a managed vLLM started with `--kv-connector engine` or `mp_native`: send a long prompt with a
fresh nonce (cold: nothing anywhere has it), wait until the stores settle (the engine stops
growing, the lmcache server's L2 stores stop moving), restart, send the same prompt again. Both
calls stream, so each has a time to first token; the restarted one should be served by the KV
tier (external hits), since the new vLLM's own prefix cache is empty.

Restart modes: `vllm` restarts vLLM only (the MP stack then serves from the lmcache server's
L1); `stack` (MP only) also restarts the lmcache server between stopping and starting vLLM, so
its L1 is empty and every hit comes from L2, the engine.

Only a vLLM this data dir manages can be restarted here: when the tools talk to a configured
vLLM (named by URL, run elsewhere) the proof is refused with that target named, and so is
`stack` when the lmcache server is a configured one. A managed vLLM on a configured lmcache
server (`GRAPH_KVCACHE_LMCACHE_URL`) is measured with `vllm`, its split read from that server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Annotated, Literal

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.opener import (
    engine_environment,
    resolve_kv_target,
    sync_client_for,
)
from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp
from graph_kvcache_mcp.connectors.vllm.access import open_client
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.lmcache.config import MP_CONNECTOR_CLASS
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.targets import Configured, Target, not_managed_here
from graph_kvcache_mcp.errors import VllmProcessError
from graph_kvcache_mcp.services.stack.description import StackDescription
from graph_kvcache_mcp.services.stack.runtime import lmcache_target
from graph_kvcache_mcp.services.stack.stack import Stack
from graph_kvcache_mcp.services.stack.vllm import open_metered_client

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient
    from graph_kvcache_mcp.connectors.vllm.state import VllmState
    from graph_kvcache_mcp.services.stack.start import WaitProgress

RestartMode = Literal["vllm", "stack"]
ReusePromptTokens = Annotated[int, Field(ge=64, le=131072)]
"""About how long the restart test's prompt is."""
ENGINE_CONNECTOR_CLASS = "EngineKVConnector"
FILLER = "The quick brown fox jumps over the lazy dog while the river keeps running. "
SAVE_SETTLE_S = 1.0
SAVE_WAIT_S = 60.0
CANNOT_RESTART = (
    "the restart proof restarts the vLLM it measures, which only whatever runs that vLLM can do; "
    "measure a vLLM started from this data dir (vllm_start kv_connector='engine' or "
    "'mp_native', then point the tools at it)"
)


class RestartReuseCall(BaseModel):
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
    lmcache_l1_hit_tokens: int | None = Field(
        None, description="MP stack: of the external hit, found in the lmcache server's L1."
    )
    lmcache_l2_hit_tokens: int | None = Field(
        None, description="MP stack: of the external hit, found in L2 (the engine)."
    )
    engine_blocks_read: int | None = Field(
        None, description="Engine GET hits during the call (durable backend counts them)."
    )
    note: str | None = Field(None, description="Why a figure is missing, from the call's trace.")


class RestartReuseOut(BaseModel):
    """Cold call, restart, the same call again: what the engine tier saved."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int
    kv_connector: str = Field(description="EngineKVConnector or LMCacheMPConnector.")
    restarted_processes: list[str] = Field(description="What was restarted between the calls.")
    cold: RestartReuseCall
    restarted: RestartReuseCall
    ttft_speedup: float | None = Field(description="Cold TTFT / restarted TTFT.")
    restart_s: float = Field(description="Stop plus start until vLLM was healthy again.")
    engine_blocks_stored: int | None = Field(
        None, description="Blocks the cold call added to the engine (memory backend reports it)."
    )
    engine_bytes_stored: int | None = None
    engine_bytes_loaded: int | None = Field(
        None,
        description="Engine bytes the restarted call read: EngineKVConnector's own count in "
        "vLLM's /metrics; on the MP stack, engine blocks read x the size of one (equal, whole) "
        "chunk: the engine's bytes per block stored, else LMCache's L2 bytes per chunk.",
    )
    notes: list[str] = Field(default_factory=list)


async def measure_restart_reuse(
    stack: Stack,
    calls_base_url: str,
    *,
    prompt_tokens: int,
    ready_timeout_s: float = 600.0,
    progress: WaitProgress | None = None,
    mode: RestartMode = "vllm",
) -> RestartReuseOut:
    """Cold call, restart (`mode`), warm call on the stack's managed vLLM, when calls go to it
    (`calls_base_url`). The engine and the lmcache server are resolved once: the measurement's
    own client and the restarted vLLM's environment both use them.

    Raises:
        ConfigError: `calls_base_url` is not an http(s) URL.
        VllmProcessError: calls go to a configured vLLM (not managed here), no managed vLLM
            runs, it has no KV tier that survives a restart (or `stack` without a managed
            lmcache server), it does not answer, or it does not come back.
    """
    settings = stack.settings
    target = stack.vllm_target(calls_base_url)
    if isinstance(target, Configured):
        raise VllmProcessError(f"{not_managed_here(target)}: {CANNOT_RESTART}")
    running = await anyio.to_thread.run_sync(stack.describe)
    vllm = _running(running)
    connector = running.connector
    server = _lmcache_of(running, mode, lmcache_target(settings))
    model = vllm.served_model_name
    # On the MP stack the client's traces split the external hit by the server's own counters.
    opened = partial(open_client if server is None else open_metered_client, settings)
    engine = await anyio.to_thread.run_sync(resolve_kv_target, settings)
    # The engine's token only where it is used: EngineKVConnector's vLLM, not the MP one's.
    env = engine_environment(engine, settings) if server is None else None
    kv = sync_client_for(engine, settings)
    try:
        async with opened(base_url=vllm.base_url) as client:
            prompt = await _prompt_of(client, model, prompt_tokens)
            before = await anyio.to_thread.run_sync(kv.engine_stats)
            cold = await _call(client, prompt, model, kv)
        after = await anyio.to_thread.run_sync(_settled_stats, kv)
        stored_l2 = None if server is None else await _settled_l2_stores(server)
        between, restarted_processes = _while_stopped(stack, server, mode)
        began = time.monotonic()
        await anyio.to_thread.run_sync(
            lambda: stack.vllm.restart(
                env=env,
                ready_timeout_s=ready_timeout_s,
                progress=progress,
                while_stopped=between,
            )
        )
        restart_s = time.monotonic() - began
        async with opened(base_url=vllm.base_url) as client:
            restarted = await _call(client, prompt, model, kv)
    finally:
        kv.close()
    blocks, stored = _stored(before, after)
    loaded = _bytes_loaded(server, restarted, blocks, stored, stored_l2)
    return RestartReuseOut(
        prompt_tokens=cold.prompt_tokens,
        kv_connector=connector or "none",
        restarted_processes=restarted_processes,
        cold=cold,
        restarted=restarted,
        ttft_speedup=_speedup(cold, restarted),
        restart_s=round(restart_s, 3),
        engine_blocks_stored=blocks,
        engine_bytes_stored=stored,
        engine_bytes_loaded=loaded,
        notes=_notes(connector, restarted, loaded),
    )


def _running(stack: StackDescription) -> VllmState:
    if stack.vllm is None:
        raise VllmProcessError(
            f"no managed vLLM runs for {stack.data_dir}: start one with vllm_start "
            "kv_connector='engine' or 'mp_native' first"
        )
    return stack.vllm


def _while_stopped(
    stack: Stack, server: str | None, mode: RestartMode
) -> tuple[Callable[[], object] | None, list[str]]:
    """What runs while vLLM is down (`stack`: restarting the lmcache server), and the names of
    the processes the measurement restarts."""
    if mode != "stack" or server is None:
        return None, ["vllm"]
    return stack.restart_server, ["vllm", "lmcache server"]


def _bytes_loaded(
    server: str | None,
    restarted: RestartReuseCall,
    blocks: int | None,
    stored: int | None,
    stored_l2: LmcacheCounters | None,
) -> int | None:
    """Engine bytes the restarted call read: the connector's own count, or on the MP stack the
    blocks read times one chunk's size (the engine's bytes per block, else LMCache's L2 one)."""
    if server is None or restarted.engine_blocks_read is None:
        return restarted.engine_bytes_read
    chunk = stored // blocks if blocks and stored else None
    chunk = chunk or (stored_l2.l2_chunk_bytes if stored_l2 is not None else None)
    return None if chunk is None else restarted.engine_blocks_read * chunk


def _speedup(cold: RestartReuseCall, restarted: RestartReuseCall) -> float | None:
    if cold.ttft_s is None or not restarted.ttft_s:
        return None
    return round(cold.ttft_s / restarted.ttft_s, 2)


def _lmcache_of(stack: StackDescription, mode: RestartMode, configured: Target) -> str | None:
    """The HTTP URL of the lmcache server an MP vLLM uses: the configured one, else the managed
    one its wiring names (None for EngineKVConnector).

    Raises:
        VllmProcessError: the vLLM has no KV tier that survives it, its server is neither ours
            nor configured, or `stack` would restart a configured server.
    """
    if stack.connector == ENGINE_CONNECTOR_CLASS:
        if mode == "stack":
            raise VllmProcessError(
                "restart='stack' restarts the lmcache server too, but the managed vLLM uses "
                "EngineKVConnector (no lmcache server): use restart='vllm'"
            )
        return None
    if stack.connector != MP_CONNECTOR_CLASS:
        raise VllmProcessError(
            "the managed vLLM was started without kv_connector 'engine' or 'mp_native': a "
            "restart would only lose its prefix cache. Stop it and start it with one of them"
        )
    if isinstance(configured, Configured):
        if mode == "stack":
            refusal = not_managed_here(configured)
            raise VllmProcessError(
                f"restart='stack' restarts the lmcache server too, but {refusal}: use "
                "restart='vllm'"
            )
        return configured.url
    server = stack.vllm_server
    if server is None:
        port = None if stack.vllm is None else stack.vllm.wiring.lmcache_port
        raise VllmProcessError(
            f"the managed vLLM uses the lmcache server on port {port}, which "
            f"is not the one started from {stack.data_dir}: start the stack with vllm_start "
            "kv_connector='mp_native'"
        )
    return server.http_url


def _notes(connector: str | None, restarted: RestartReuseCall, loaded: int | None) -> list[str]:
    notes: list[str] = []
    if connector == ENGINE_CONNECTOR_CLASS and restarted.external_hit_tokens and loaded is None:
        notes.append(
            "engine bytes loaded are unknown: vLLM's /metrics has no "
            "graph_kvcache:engine_kv_loaded_bytes_total (is vLLM's copy of graph-kvcache-mcp "
            "older than this one?)"
        )
    if not restarted.external_hit_tokens:
        where = "EngineKVConnector" if connector == ENGINE_CONNECTOR_CLASS else "LMCache"
        notes.append(
            f"the restarted call loaded nothing from the KV tier: check vllm_logs for {where} "
            "warnings (engine or lmcache server unreachable, blocks rejected)"
        )
    return notes


async def _prompt_of(client: VllmClient, model: str, tokens: int) -> str:
    """A prompt of about `tokens` tokens that no cache can hold yet (a fresh nonce first)."""
    per_filler = await client.tokenize(FILLER * 8, model=model)
    if isinstance(per_filler, Unavailable):
        raise VllmProcessError(f"vLLM does not answer: {per_filler.reason}")
    repeats = max(1, tokens * 8 // max(1, per_filler))
    return f"Run {uuid.uuid4().hex}. " + FILLER * repeats


async def _call(client: VllmClient, prompt: str, model: str, kv: SyncKvClient) -> RestartReuseCall:
    """One streamed call; its trace splits the hit by tier (the client reads vLLM's /metrics
    around it while vLLM runs a KV connector, and on the MP stack the lmcache server's own
    counters split the external part into L1 and L2)."""
    engine_before = await anyio.to_thread.run_sync(kv.engine_stats)
    result = await client.complete(prompt, model=model, max_tokens=1, stream=True)
    if isinstance(result, Unavailable):
        raise VllmProcessError(f"vLLM does not answer: {result.reason}")
    engine_after = await anyio.to_thread.run_sync(kv.engine_stats)
    trace = result.trace
    return RestartReuseCall(
        ttft_s=trace.ttft_s,
        latency_s=trace.latency_s,
        prompt_tokens=trace.prompt_tokens,
        cached_tokens=trace.prefix_cache_hit_tokens,
        external_hit_tokens=trace.external_cache_hit_tokens,
        engine_bytes_read=trace.external_bytes_read,
        lmcache_l1_hit_tokens=trace.lmcache_l1_hit_tokens,
        lmcache_l2_hit_tokens=trace.lmcache_l2_hit_tokens,
        engine_blocks_read=_get_hits(engine_before, engine_after),
        note=trace.note,
    )


async def _settled_l2_stores(http_url: str) -> LmcacheCounters | None:
    """The lmcache server's counters once its L2 store counter stops moving (stores run after
    the answer), bounded by SAVE_WAIT_S; None when they cannot be read."""
    last: LmcacheCounters | Unavailable = Unavailable("not read")
    with anyio.move_on_after(SAVE_WAIT_S):
        async with LmcacheHttp(http_url) as http:
            last = await http.counters()
            while not isinstance(last, Unavailable):
                await anyio.sleep(SAVE_SETTLE_S)  # no completion signal outside the server
                now = await http.counters()
                if isinstance(now, Unavailable) or now.l2_stored_chunks == last.l2_stored_chunks:
                    break
                last = now
    return None if isinstance(last, Unavailable) else last


def _get_hits(before: EngineStats | Unavailable, after: EngineStats | Unavailable) -> int | None:
    if not isinstance(before, EngineStats) or not isinstance(after, EngineStats):
        return None
    if before.get_hits is None or after.get_hits is None:
        return None
    return after.get_hits - before.get_hits


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
