"""The address an LMCache server on another host registers under at its coordinator.

A node's server advertises the loopback address `127.X.Y.Z` derived from its host's IPv4
address `W.X.Y.Z` (the first octet dropped, 127 put in its place), and the store host's edge
maps that address to the node (`domain/edge/store.advertised_loopback`, the one rule). The
operator reaches the same server at `https://W.X.Y.Z:A`, so finding its registration takes both
spellings.
"""

from __future__ import annotations

import ipaddress

from graph_kvcache_mcp.domain.edge.store import advertised_loopback


def registered_ips(host: str) -> tuple[str, ...]:
    """Every IP the server reached at `host` may have registered under: `host` itself and, for
    a non-loopback IPv4 address, the loopback address its node advertises."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return (host,)
    if not isinstance(address, ipaddress.IPv4Address) or address.is_loopback:
        return (host,)
    return (host, str(advertised_loopback(address)))
