"""The kv toolset's guides: the kv://stats resource and the diagnose_kv_cache prompt (which walks
the whole stack: engine, vLLM, LMCache and the diagnose tools)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from mcp.server.mcpserver.exceptions import ResourceError
from pydantic import Field

from graph_kvcache_mcp.connectors.engine.access import KvAccess
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from graph_kvcache_mcp.state import AppState

# Static resources get no Context in SDK 2.3, so the resource finds the live state by server.
StatsSource = Callable[[KvAccess], Awaitable[KvStatsOut]]

DIAGNOSE_PROMPT = """\
Diagnose this KV-cache stack (the engine's KV store, vLLM's prefix cache, LMCache) step by step,
and report plainly. Skip a step whose tools this server does not list.
{symptom_line}
1. Call diagnose_stack (add lmcache_url when an `lmcache server` runs). Fix every error finding
   first, in order; each finding names its evidence and the fix. Nothing reachable: start the
   parts you need (engine_start, vllm_start) and call it again.
2. Engine: call kv_probe. If reachable is false, stop: quote its reason and the fix it names
   (engine_start, EPISTEMIC_GRAPH_KVCACHE_URL, or the token). Then kv_stats: the memory backend
   reports occupancy but never counts gets; the durable one counts hits but not occupancy; a null
   field means "not reported", not zero. A low engine hit_rate means readers ask for keys nobody
   stored (keys are raw, never percent-encoded); zero dedup after a repeated workload means keys
   differ between runs.
3. vLLM: vllm_status says what runs and with which flags; vllm_metrics gives prefix-cache
   queries and hits (pass `since` to measure one workload). A request that should have hit but
   did not: call diagnose_miss with the previous request and this one (verify=true sends both);
   it names the cause (volatile_value, reordered, whitespace, short_prefix, new_turn, edited)
   and the fix.
4. LMCache: lmcache_check validates the adapter against the engine; lmcache_config prints the
   commands; diagnose_budget says whether a model's chunks fit the engine's 64 MiB value cap.
5. To prove a warm cache end to end: vllm_start, bundle_compile, bundle_chat twice on the same
   key (the second call's prefix_cache_hit_tokens should be > 0), then diagnose_stack.
Finish with: status (healthy / degraded / down), the evidence, and the next action.
"""


def diagnose_kv_cache(
    symptom: Annotated[
        str, Field(description="Optional: what looks wrong (e.g. 'hit rate is zero').")
    ] = "",
) -> str:
    """Walk through diagnose_stack, then engine, vLLM and LMCache checks and what they mean."""
    line = f"Reported symptom: {symptom.strip()}\n" if symptom.strip() else ""
    return DIAGNOSE_PROMPT.format(symptom_line=line)


def register(server: Registrar, *, stats: StatsSource) -> None:
    """Add the kv://stats resource (served by `stats`) and the diagnose_kv_cache prompt."""

    async def kv_stats_resource() -> str:
        state = server.live_state()
        if not isinstance(state, AppState):  # None: not running yet
            raise ResourceError("server is not running; connect a client first")
        return (await stats(state.kv)).model_dump_json(indent=2)

    server.resource(
        "kv://stats",
        name="kv_stats",
        title="KV store stats",
        description="Current normalized KV store stats as JSON (same shape as kv_stats).",
        mime_type="application/json",
    )(kv_stats_resource)
    server.prompt(
        name="diagnose_kv_cache",
        title="Diagnose the KV cache",
        description="Walks a model through the whole stack: diagnose_stack, the engine (kv_probe, "
        "kv_stats), vLLM (diagnose_miss), LMCache, and a warm-cache check.",
    )(diagnose_kv_cache)
