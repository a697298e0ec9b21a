"""fleet_status's memory: each fleet instance's LMCache server's L1 and the shared L2 (the engine),
read from the coordinator each server joined (or the fleet file's `coordinator_url`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread

from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection
from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp
from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.domain.fleet.memory import (
    FleetMemory,
    PoolUse,
    ServerMemory,
    server_memory,
    shared_pools,
)
from graph_kvcache_mcp.domain.fleet.tier_trust import (
    Predecessor,
    own_registration,
    predecessor_reason,
)
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.services.fleet.tiers import ENGINE_CONNECTOR, TierSources


async def fleet_memory(conn: FleetConnection, sources: TierSources) -> FleetMemory | None:
    """Every LMCache server behind the fleet's instances, with its pools; None when no instance
    has one (the fleet is vLLM's own caches only)."""
    served: dict[str, list[str]] = {}
    for name in conn.names:
        url = await anyio.to_thread.run_sync(sources.lmcache_url, conn, name)
        if url is not None and url != ENGINE_CONNECTOR:
            served.setdefault(url, []).append(name)
    if not served:
        return None
    usages: dict[str, dict[str, Any] | Unavailable] = {}
    servers = [await _server(conn, url, names, usages) for url, names in served.items()]
    shared: dict[tuple[str, str], PoolUse] = {}
    for usage in usages.values():
        if not isinstance(usage, Unavailable):
            for pool in shared_pools(usage):  # one engine behind several coordinators: once
                shared.setdefault((pool.tier, pool.backend), pool)
    return FleetMemory(servers=servers, shared_l2=list(shared.values()))


async def _server(
    conn: FleetConnection,
    url: str,
    names: list[str],
    usages: dict[str, dict[str, Any] | Unavailable],
) -> ServerMemory:
    def unknown(reason: str) -> ServerMemory:
        return ServerMemory(server=url, instances=names, reason=reason)

    async with LmcacheHttp(url, tls=conn.tls) as server:
        keying = await server.keying()
        started = await server.started_s()
        reported = await server.instance_id()
    if isinstance(keying, Unavailable):
        return unknown(f"unknown: {keying.reason}")
    coordinator_url = conn.fleet.coordinator_url or keying.coordinator_url
    if coordinator_url is None:
        return unknown("not checked: the server joined no coordinator (fleet memory comes from it)")
    parts = urlsplit(url)
    async with CoordinatorHttp(coordinator_url, tls=conn.tls) as coordinator:
        found = await coordinator.registrations(parts.hostname or "", parts.port or 0)
        if coordinator.url not in usages:
            usages[coordinator.url] = await coordinator.usage()
        usage = usages[coordinator.url]
    if isinstance(found, Unavailable):
        return unknown(f"unknown: {found.reason}")
    if isinstance(usage, Unavailable):
        return unknown(f"unknown: {usage.reason}")
    own = own_registration(found, started, reported)
    if own is None:
        return unknown(f"not checked: the server is not registered with {coordinator.url}")
    if isinstance(own, Predecessor):
        return unknown(predecessor_reason(url, own))
    return server_memory(usage, own.instance_id, server=url, instances=names)
