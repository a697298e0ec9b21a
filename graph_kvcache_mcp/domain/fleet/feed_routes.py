"""Where this host reads a fleet's `tls://` feeds: one outbound edge route per feed.

pyzmq cannot speak TLS, so a feed on another host is read through this host's edge: an outbound
`tcp` route listens on loopback in the clear and carries the bytes to the node's edge with mutual
TLS, checking the node's certificate against the instance's `tls_name`. The feed reader then
connects to the route's loopback end.

Each feed's local port is derived from what it reaches (peer address, port and name), not from
its place in the file, so the same fleet always asks for the same routes (a running edge with
them is reused) and reordering the file changes nothing. A port some neighbour holds is not
guessed around here: the edge proves it holds every listener it starts, and refuses to start
when one is taken, naming the holder.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass, field

from graph_kvcache_mcp.domain.edge.routes import Outbound
from graph_kvcache_mcp.domain.fleet.fleet_file import TLS_FEED_SCHEME, Fleet, tls_feed_address

FEED_PORT_BASE = 27100
FEED_PORT_SPAN = 2000
"""Loopback ports 27100-29099 carry this host's feed routes (below the kernel's ephemeral range,
clear of the ports the stack binds by default)."""


@dataclass(frozen=True)
class FeedRoutes:
    """The outbound routes a fleet's `tls://` feeds need, and the loopback end of each feed."""

    outbound: tuple[Outbound, ...] = ()
    local: dict[str, str] = field(default_factory=dict)
    """`tls://HOST:PORT` as the file names it -> `tcp://127.0.0.1:LOCAL`, where the reader
    connects."""

    def endpoint(self, named: str) -> str:
        """Where the reader connects for the feed the file names `named`."""
        return self.local.get(named, named)


def feed_routes(fleet: Fleet) -> FeedRoutes:
    """Every `tls://` feed of `fleet` mapped to a loopback port of its own (see the module
    docstring). The file was checked by `parse_fleet`: each such feed has an IPv4 host and its
    instance a `tls_name`."""
    wanted: dict[str, tuple[str, int, str]] = {}
    for item in fleet.instances:
        identity = fleet.identity(item.tls_name)
        if identity is None or identity.peer_name is None:
            continue  # no tls:// feed (parse_fleet refuses one without tls_dir and tls_name)
        for endpoint in item.feeds():
            if endpoint.startswith(TLS_FEED_SCHEME):
                host, port = tls_feed_address(endpoint, what=f"instance {item.name!r}")
                wanted[endpoint] = (host, port, identity.peer_name)
    taken: set[int] = set()
    outbound: list[Outbound] = []
    local: dict[str, str] = {}
    for endpoint, (host, port, name) in sorted(wanted.items()):
        listen = _free_port(f"{host}:{port}@{name}", taken)
        taken.add(listen)
        outbound.append(
            Outbound(
                mode="tcp",
                listen_port=listen,
                peer_ip=ipaddress.IPv4Address(host),
                peer_port=port,
                peer_name=name,
            )
        )
        local[endpoint] = f"tcp://127.0.0.1:{listen}"
    return FeedRoutes(tuple(outbound), local)


def _free_port(key: str, taken: set[int]) -> int:
    """The port `key` hashes to, or the next one up (wrapping) that no other feed took."""
    start = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % FEED_PORT_SPAN
    for step in range(FEED_PORT_SPAN):
        port = FEED_PORT_BASE + (start + step) % FEED_PORT_SPAN
        if port not in taken:
            return port
    raise ValueError(f"more than {FEED_PORT_SPAN} tls:// feeds")  # MAX_ROUTES is far below
