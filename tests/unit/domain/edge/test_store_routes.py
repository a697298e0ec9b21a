"""The store host's route arithmetic: routes added to an edge (union, carried, withdrawn), the
node's advertised loopback address, and the `--listen` / `--node` forms."""

from __future__ import annotations

import ipaddress

import pytest

from graph_kvcache_mcp.domain.edge.routes import Inbound, routes_of
from graph_kvcache_mcp.domain.edge.store import (
    advertised_loopback,
    callback_route,
    check_in_certificate,
    parse_listen,
    parse_node,
    published_routes,
)
from graph_kvcache_mcp.errors import InvalidValue

ENGINE = routes_of(["http:10.0.0.1:9443>9130"], [])
COORDINATOR = routes_of(["http:10.0.0.1:9444>9300"], ["http:127.0.0.2:9560>10.0.0.2:9560@node-2"])


def test_the_union_of_two_services_routes_holds_each_once() -> None:
    both = ENGINE.union(COORDINATOR)
    assert [r.spec for r in both.all()] == [
        "http:10.0.0.1:9443>127.0.0.1:9130",
        "http:10.0.0.1:9444>127.0.0.1:9300",
        "http:127.0.0.2:9560>10.0.0.2:9560@node-2",
    ]
    assert both.union(ENGINE) == both
    assert both.carries(ENGINE) and both.carries(COORDINATOR)
    assert not ENGINE.carries(both)


def test_a_different_route_on_a_listener_the_edge_holds_is_refused_naming_both() -> None:
    moved = routes_of(["http:10.0.0.1:9443>9999"], [])
    with pytest.raises(InvalidValue) as caught:
        ENGINE.union(moved)
    message = str(caught.value)
    assert "http:10.0.0.1:9443>127.0.0.1:9130" in message
    assert "http:10.0.0.1:9443>127.0.0.1:9999" in message


def test_withdrawing_routes_keeps_the_rest_and_none_is_left_when_all_go() -> None:
    both = ENGINE.union(COORDINATOR)

    def to_engine(route: object) -> bool:
        return isinstance(route, Inbound) and route.target_port == 9130

    kept = both.without(to_engine)
    assert kept is not None and kept.all() == COORDINATOR.all()
    assert ENGINE.without(to_engine) is None


@pytest.mark.parametrize(
    ("node", "loopback"),
    [("10.0.0.2", "127.0.0.2"), ("192.168.7.33", "127.168.7.33"), ("10.254.3.1", "127.254.3.1")],
)
def test_a_node_advertises_its_address_with_127_as_first_octet(node: str, loopback: str) -> None:
    assert str(advertised_loopback(ipaddress.IPv4Address(node))) == loopback


def test_a_nodes_callback_route_maps_its_loopback_address_to_its_edge() -> None:
    route = callback_route(parse_node("node-2@10.0.3.2:9560"))
    assert route.spec == "http:127.0.3.2:9560>10.0.3.2:9560@node-2"


def test_two_nodes_sharing_their_last_three_octets_are_refused() -> None:
    listen = parse_listen("10.0.0.1:9444")
    first = published_routes(listen, 9300, [parse_node("node-a@10.0.0.2:9560")])
    second = published_routes(listen, 9300, [parse_node("node-b@11.0.0.2:9560")])
    with pytest.raises(InvalidValue, match="cannot also carry"):
        first.union(second)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("10.0.0.1", "needs a port"),
        ("10.0.0.1:0", "needs a port"),
        ("store:9443", "not an IPv4 address"),
        ("127.0.0.1:9443", "not a host's network address"),
        ("0.0.0.0:9443", "not a host's network address"),
    ],
)
def test_a_bad_listen_address_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(InvalidValue, match=says):
        parse_listen(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("10.0.0.2:9560", "names no node"),
        ("Node_2@10.0.0.2:9560", "not a DNS name"),
        ("node-2@10.0.0.2", "needs a port"),
    ],
)
def test_a_bad_node_says_what_is_wrong_and_shows_the_form(text: str, says: str) -> None:
    with pytest.raises(InvalidValue, match=says) as caught:
        parse_node(text)
    assert "NAME@IP:PORT" in str(caught.value)


def test_a_listen_address_outside_the_certificate_is_refused_with_its_addresses() -> None:
    check_in_certificate(parse_listen("10.0.0.1:9443"), ["10.0.0.1"])
    with pytest.raises(InvalidValue) as caught:
        check_in_certificate(parse_listen("10.0.0.5:9443"), ["10.0.0.1", "10.0.0.9"])
    assert "IP SANs: 10.0.0.1, 10.0.0.9" in str(caught.value)
