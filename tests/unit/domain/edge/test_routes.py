"""The edge's routes from their CLI forms, and the haproxy configuration rendered from them."""

from __future__ import annotations

import ipaddress
from pathlib import PurePath

import pytest
from pydantic import ValidationError

from graph_kvcache_mcp.domain.edge.haproxy import EdgeFiles, render
from graph_kvcache_mcp.domain.edge.routes import (
    EdgeRoutes,
    Inbound,
    parse_inbound,
    parse_outbound,
    routes_of,
)
from graph_kvcache_mcp.errors import ConfigError, InvalidValue

FILES = EdgeFiles(
    certificate=PurePath("/d/edge/tls/host.pem"),
    ca=PurePath("/d/edge/tls/ca.pem"),
    stats_socket=PurePath("/d/edge/stats.sock"),
)


def test_an_inbound_route_forwards_to_loopback_by_default() -> None:
    route = parse_inbound("http:10.0.0.1:9443>9130")
    assert (route.mode, str(route.listen_ip), route.listen_port) == ("http", "10.0.0.1", 9443)
    assert (str(route.target_ip), route.target_port) == ("127.0.0.1", 9130)


def test_an_outbound_route_listens_on_loopback_and_names_its_peer() -> None:
    route = parse_outbound("tcp:127.0.1.12:8081>10.0.0.2:9581@node-2")
    assert (str(route.listen_ip), route.listen_port) == ("127.0.1.12", 8081)
    assert (str(route.peer_ip), route.peer_port, route.peer_name) == ("10.0.0.2", 9581, "node-2")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("10.0.0.1:9443>9130", "must start with http: or tcp:"),
        ("udp:10.0.0.1:9443>9130", "must start with http: or tcp:"),
        ("http:9443>9130", "needs an IP"),
        ("http:10.0.0.1:99999>9130", "port 1-65535"),
        ("http:10.0.0.1:9443>10.0.0.5:9130", "loopback only"),
        ("http:0.0.0.0:9443>9130", "not 0.0.0.0"),
        ("http:host:9443>9130", "not an IPv4 address"),
    ],
)
def test_a_bad_inbound_route_is_refused_with_the_form(spec: str, says: str) -> None:
    with pytest.raises(InvalidValue, match=says):
        parse_inbound(spec)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("http:19130>10.0.0.1:9443", "names no peer"),
        ("http:10.0.0.9:19130>10.0.0.1:9443@store", "loopback only"),
        ("http:19130>10.0.0.1:9443@Store", "not a DNS name"),
        ("http:19130>9443@store", "needs an IP"),
    ],
)
def test_a_bad_outbound_route_is_refused_with_the_form(spec: str, says: str) -> None:
    with pytest.raises(InvalidValue, match=says):
        parse_outbound(spec)


def test_an_edge_needs_a_route_and_distinct_listeners() -> None:
    with pytest.raises(InvalidValue, match="at least one"):
        routes_of([], [])
    with pytest.raises(InvalidValue, match=r"two routes listen on 127\.0\.0\.1:9443"):
        routes_of(["http:127.0.0.1:9443>9130"], ["tcp:9443>10.0.0.2:1@node"])


def test_the_config_requires_fleet_certificates_both_ways_and_pools_http_hops() -> None:
    routes = routes_of(
        ["http:10.0.0.1:9443>9130", "tcp:10.0.0.1:9557>5557"],
        ["http:19130>10.0.0.2:9443@store"],
    )
    text = render(routes, FILES)
    assert "stats socket /d/edge/stats.sock mode 600 level admin" in text
    assert (
        "bind 10.0.0.1:9443 ssl crt /d/edge/tls/host.pem ca-file /d/edge/tls/ca.pem "
        "verify required" in text
    )
    assert "server local 127.0.0.1:9130" in text
    assert "bind 127.0.0.1:19130\n" in text
    assert (
        "server peer 10.0.0.2:9443 ssl crt /d/edge/tls/host.pem ca-file /d/edge/tls/ca.pem "
        "verify required verifyhost store sni str(store)" in text
    )
    assert "timeout tunnel 1h" in text
    blocks = text.split("\nlisten ")[1:]
    modes = {block.split("\n")[0]: block for block in blocks}
    assert len(modes) == 3
    for name, block in modes.items():
        assert ("http-reuse always" in block) == name.startswith(("in_http", "out_http"))
        assert f"mode {'http' if '_http_' in name else 'tcp'}" in block


def test_a_path_haproxy_would_interpret_is_refused() -> None:
    routes = routes_of(["http:10.0.0.1:9443>9130"], [])
    files = FILES.model_copy(update={"ca": PurePath("/d/my dir/$HOME/ca.pem")})
    with pytest.raises(ConfigError, match="interpret"):
        render(routes, files)


def test_a_public_api_route_skips_client_certificates_and_others_keep_requiring_them() -> None:
    api = Inbound(
        mode="http",
        listen_ip="10.0.0.2",
        listen_port=8443,
        target_port=8000,
        client_certificate="none",
    )
    feed = Inbound(
        mode="tcp", listen_ip="10.0.0.2", listen_port=8444, target_socket="/d/vllm/kv-events.sock"
    )
    text = render(EdgeRoutes(inbound=[api, feed]), FILES)
    assert "bind 10.0.0.2:8443 ssl crt /d/edge/tls/host.pem verify none\n" in text
    assert (
        "bind 10.0.0.2:8444 ssl crt /d/edge/tls/host.pem ca-file /d/edge/tls/ca.pem "
        "verify required\n  server local unix@/d/vllm/kv-events.sock" in text
    )
    assert feed.client_certificate == "required"  # mutual TLS stays the default


def test_an_inbound_route_forwards_to_exactly_one_local_target() -> None:
    with pytest.raises(ValidationError, match="a loopback port or a unix socket"):
        Inbound(
            mode="tcp",
            listen_ip="10.0.0.2",
            listen_port=1,
            target_port=2,
            target_socket="/d/s.sock",
        )
    with pytest.raises(ValidationError, match="a loopback port or a unix socket"):
        Inbound(mode="tcp", listen_ip="10.0.0.2", listen_port=1)
    with pytest.raises(ValidationError, match="absolute path"):
        Inbound(mode="tcp", listen_ip="10.0.0.2", listen_port=1, target_socket="d/s.sock")


def test_an_inbound_route_to_a_unix_socket_names_it_and_its_open_door_in_its_spec() -> None:
    route = Inbound(
        mode="tcp",
        listen_ip=ipaddress.IPv4Address("10.0.0.2"),
        listen_port=8444,
        target_socket="/run/vllm/kv-events.sock",
        client_certificate="none",
    )
    assert route.spec == "tcp:10.0.0.2:8444>unix@/run/vllm/kv-events.sock (no client certificate)"
    assert parse_inbound("http:10.0.0.2:8443>8000").spec == "http:10.0.0.2:8443>127.0.0.1:8000"
