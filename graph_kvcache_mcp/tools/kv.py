"""KV store tools (kv_*): stats, probe, get, put, exists. Thin adapters over services/."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from graph_kvcache_mcp.services.kv_views import KvStatsOut
from graph_kvcache_mcp.tools._common import READ_ONLY, ToolSpec, register_all, state_of

TOOLSET = "kv"


async def kv_stats(ctx: Context[Any]) -> KvStatsOut:
    """Report the engine KV store's normalized counters (which backend, blocks, bytes, dedup,
    hit rate) and this server's own client counters. reachable=false means the store is down:
    report the reason instead of retrying."""
    kv = await state_of(ctx).kv.client()
    return KvStatsOut.from_outcome(kv.base_url, await kv.stats())


SPECS = (ToolSpec(kv_stats, "KV store stats", READ_ONLY),)


def register(server: MCPServer[Any], *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
