"""`kv_stats` / `kv stats`: the engine's counters and this client's, plus LMCache's L2 counters.

On the mp_native stack an lmcache server writes its L2 to this engine (the configured one, else
the data dir's managed one); its counters (stores, lookups by tier) come along, so one call
shows both sides of the tier.
"""

from __future__ import annotations

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from graph_kvcache_mcp.services.stack.runtime import engine_l2_counters, lmcache_target


async def kv_stats(kv: KvClient, settings: Settings) -> KvStatsOut:
    """The store's counters, with the L2 counters of the lmcache server writing to it (when
    one does and answers)."""
    out = KvStatsOut.from_outcome(kv.base_url, await kv.stats())
    lmcache = await engine_l2_counters(lmcache_target(settings), kv.base_url)
    return out if lmcache is None else out.model_copy(update={"lmcache": lmcache})
