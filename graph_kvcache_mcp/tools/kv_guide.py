"""The kv toolset's guides: the kv://stats resource and the diagnose_kv_cache prompt."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from pydantic import Field

from graph_kvcache_mcp.connectors.kv_access import KvAccess
from graph_kvcache_mcp.services.kv_views import KvStatsOut
from graph_kvcache_mcp.state import live_state

# Static resources get no Context in SDK 2.3, so the resource finds the live state by server.
StatsSource = Callable[[KvAccess], Awaitable[KvStatsOut]]

DIAGNOSE_PROMPT = """\
Diagnose this server's KV cache store step by step, and report plainly.
{symptom_line}
1. Call kv_probe. If reachable is false, stop: quote its reason and the fix it names (start the
   engine with engine_start, set EPISTEMIC_GRAPH_KVCACHE_URL, or fix the token). If a check failed,
   quote that check's detail.
2. Call kv_stats. Note the backend: the memory backend reports occupancy (unique_blocks,
   resident_bytes, logical_bytes) but never counts gets; the durable backend counts hits and misses
   but not occupancy. A null field means "not reported", not zero.
3. Interpret:
   - hit_rate: low with hit_rate_source=engine means readers ask for keys nobody stored (check the
     key convention: keys are raw, never percent-encoded); source=client covers only this server.
   - dedup_hit_share / dedup_ratio: high means many writers store the same blocks (good reuse);
     zero after a repeated workload means keys differ between runs (volatile bytes in the key).
   - errors in the client counters: the store failed requests; the probe's details say why.
4. To measure a workload, keep kv_stats' `engine` object, run it, then call kv_stats with
   since=<that object> and report `delta`.
Finish with: status (healthy / degraded / down), the evidence, and the next action.
"""


def diagnose_kv_cache(
    symptom: Annotated[
        str, Field(description="Optional: what looks wrong (e.g. 'hit rate is zero').")
    ] = "",
) -> str:
    """Walk through kv_probe -> kv_stats -> interpretation of the KV cache store."""
    line = f"Reported symptom: {symptom.strip()}\n" if symptom.strip() else ""
    return DIAGNOSE_PROMPT.format(symptom_line=line)


def register(server: MCPServer[Any], *, stats: StatsSource) -> None:
    """Add the kv://stats resource (served by `stats`) and the diagnose_kv_cache prompt."""

    async def kv_stats_resource() -> str:
        state = live_state(server)
        if state is None:
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
        description="Walks a model through kv_probe, kv_stats and what the numbers mean.",
    )(diagnose_kv_cache)
