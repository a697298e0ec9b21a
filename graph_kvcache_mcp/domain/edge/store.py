"""The store host's routes (issue #37): the engine and LMCache's coordinator published on the
host's edge, and the coordinator's calls back to each node. Pure: no I/O.

LMCache's coordinator calls a server back at the address the server advertised (prefetch,
delete). A node advertises the loopback address `127.X.Y.Z` derived from its own IPv4 address
`W.X.Y.Z` (`advertised_loopback`), so on the store host that call lands on the edge's outbound
route for that node (`callback_route`), which carries it to the node's edge with mutual TLS. Two
nodes whose last three octets agree would need one loopback address: the edge refuses the
second (`EdgeRoutes.union`).

CLI forms: `--listen IP:PORT` (`parse_listen`), `--node NAME@IP:PORT` (`parse_node`).
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

from graph_kvcache_mcp.domain.edge.pki import check_host_name
from graph_kvcache_mcp.domain.edge.routes import EdgeRoutes, Inbound, Outbound, Route
from graph_kvcache_mcp.errors import InvalidValue

_LISTEN_FORM = "IP:PORT, the host's address the edge listens on, e.g. 10.0.0.1:9443"
_NODE_FORM = (
    "NAME@IP:PORT, the node's certificate name, address and admin port, e.g. node-2@10.0.0.2:9560"
)


class Address(NamedTuple):
    """An IPv4 address and a port."""

    ip: ipaddress.IPv4Address
    port: int

    def __str__(self) -> str:
        return f"{self.ip}:{self.port}"


class Node(NamedTuple):
    """A node the store's coordinator calls back: its certificate name and admin address."""

    name: str
    address: Address

    def __str__(self) -> str:
        return f"{self.name}@{self.address}"


def parse_listen(text: str) -> Address:
    """The host address and port of `--listen`.

    Raises:
        InvalidValue: not IP:PORT, not an IPv4 unicast address of a host (loopback and 0.0.0.0
            are refused: the edge publishes on the network), or a port outside 1-65535.
    """
    return _address(text, f"--listen {text[:80]!r}", _LISTEN_FORM)


def parse_node(text: str) -> Node:
    """A node of `--node NAME@IP:PORT`.

    Raises:
        InvalidValue: names the part that is wrong and shows the form.
    """
    name, at, where = text.partition("@")
    if not at:
        raise InvalidValue(f"--node {text[:80]!r} names no node; the form is {_NODE_FORM}")
    what = f"--node {text[:80]!r}"
    try:
        checked = check_host_name(name)
    except InvalidValue as exc:
        raise InvalidValue(f"{what}: {exc}; the form is {_NODE_FORM}") from None
    return Node(checked, _address(where, what, _NODE_FORM))


def advertised_loopback(node: ipaddress.IPv4Address) -> ipaddress.IPv4Address:
    """The loopback address a node at `node` (W.X.Y.Z) advertises to the coordinator: 127.X.Y.Z."""
    return ipaddress.IPv4Address((int(node) & 0x00FFFFFF) | (127 << 24))


def callback_route(node: Node) -> Outbound:
    """The store's outbound route for the coordinator's calls to `node`:
    `http:127.X.Y.Z:A>N:A@NAME`."""
    ip, port = node.address
    return Outbound(
        mode="http",
        listen_ip=advertised_loopback(ip),
        listen_port=port,
        peer_ip=ip,
        peer_port=port,
        peer_name=node.name,
    )


def callback_node(route: Route) -> Node | None:
    """The node whose callback route `route` is (see `callback_route`), else None."""
    if not isinstance(route, Outbound) or route.mode != "http":
        return None
    mapped = (advertised_loopback(route.peer_ip), route.peer_port)
    if (route.listen_ip, route.listen_port) != mapped:
        return None
    return Node(route.peer_name, Address(route.peer_ip, route.peer_port))


def published_routes(listen: Address, target_port: int, nodes: list[Node]) -> EdgeRoutes:
    """A service on loopback `target_port` published at `listen` (inbound `http`, mutual TLS),
    with the callback routes of `nodes`."""
    inbound = Inbound(
        mode="http", listen_ip=listen.ip, listen_port=listen.port, target_port=target_port
    )
    return EdgeRoutes(inbound=[inbound], outbound=[callback_route(node) for node in nodes])


def check_in_certificate(listen: Address, addresses: list[str]) -> None:
    """Refuse a listen address the host certificate does not name: peers check the address
    they dial against the certificate's IP SANs, so they would reject the edge.

    Raises:
        InvalidValue: lists the certificate's addresses.
    """
    if str(listen.ip) not in addresses:
        named = ", ".join(addresses) or "none"
        raise InvalidValue(
            f"--listen {listen}: {listen.ip} is not an address of the host certificate (its "
            f"IP SANs: {named}); listen on one of those, or issue a certificate for this "
            "address (`fleet pki issue --ip`)"
        )


def _address(text: str, what: str, form: str) -> Address:
    host, colon, port_text = text.rpartition(":")
    if not colon or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise InvalidValue(f"{what} needs a port 1-65535; the form is {form}")
    try:
        ip = ipaddress.IPv4Address(host)
    except ValueError:
        raise InvalidValue(
            f"{what}: {host[:80]!r} is not an IPv4 address; the form is {form}"
        ) from None
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        raise InvalidValue(
            f"{what}: {ip} is not a host's network address (loopback, 0.0.0.0 and multicast "
            f"are refused); the form is {form}"
        )
    return Address(ip, int(port_text))
