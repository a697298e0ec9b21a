"""`kv_stats` / `kv stats`: the engine's counters and this client's, plus LMCache's L2 counters.

On the mp_native stack the managed lmcache server writes its L2 to this engine; its counters
(stores, lookups by tier) come along, so one call shows both sides of the tier.
"""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.stack.tier_counters import engine_l2_counters
from graph_kvcache_mcp.services.kv.views import KvStatsOut


async def kv_stats(kv: KvClient, data_dir: Path) -> KvStatsOut:
    """The store's counters, with the L2 counters of the managed lmcache server writing to it
    (when one runs and answers)."""
    out = KvStatsOut.from_outcome(kv.base_url, await kv.stats())
    lmcache = await engine_l2_counters(data_dir, kv.base_url)
    return out if lmcache is None else out.model_copy(update={"lmcache": lmcache})
