"""The fleet file across hosts (#37 item 5): a node's `fleet_entry` pasted as is, `tls_dir`,
`tls://` feeds and what they need, the instance as targets, and the edge routes of its feeds."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from graph_kvcache_mcp.domain.edge.routes import EdgeRoutes
from graph_kvcache_mcp.domain.fleet.advertised import registered_ips
from graph_kvcache_mcp.domain.fleet.feed_routes import FEED_PORT_BASE, FEED_PORT_SPAN, feed_routes
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet, parse_fleet
from graph_kvcache_mcp.domain.targets import Configured, TlsIdentity
from graph_kvcache_mcp.errors import ConfigError

# A node's fleet_entry exactly as the contract of #37 gives it (vllm start ... --json).
FLEET_ENTRY = """{"name": "node-2", "tls_name": "node-2",
 "base_url": "https://10.0.0.2:8100/v1", "api_key_env": "VLLM_API_KEY",
 "kv_events": "tls://10.0.0.2:8101", "kv_events_replay": "tls://10.0.0.2:8102",
 "lmcache_http_url": "https://10.0.0.2:8103"}"""
TLS_DIR = "/home/op/fleet-tls"


def fleet_of(*entries: dict[str, Any], **top: Any) -> Fleet:
    raw = {"tls_dir": TLS_DIR, "instances": list(entries), **top}
    return parse_fleet(json.dumps(raw), source="fleet.json")


def entry(**change: Any) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(FLEET_ENTRY)
    return {**raw, **change}


def node(number: int) -> dict[str, Any]:
    """The fleet_entry of node-NUMBER at 10.0.0.NUMBER, in the contract's shape."""
    text = FLEET_ENTRY.replace("node-2", f"node-{number}").replace(".2:", f".{number}:")
    raw: dict[str, Any] = json.loads(text)
    return raw


def test_a_nodes_fleet_entry_parses_as_is_beside_a_tls_dir() -> None:
    text = '{"tls_dir": "' + TLS_DIR + '", "instances": [' + FLEET_ENTRY + "]}"
    fleet = parse_fleet(text, source="fleet.json")
    node = fleet.instance("node-2")
    assert node.tls_name == "node-2"
    assert node.feeds() == ("tls://10.0.0.2:8101", "tls://10.0.0.2:8102")
    assert fleet.tls_dir == TLS_DIR


def test_an_instance_is_its_vllm_and_lmcache_targets_with_the_fleets_tls_identity() -> None:
    fleet = fleet_of(entry())
    node = fleet.instance("node-2")
    identity = TlsIdentity(Path(TLS_DIR))
    assert fleet.vllm_target(node) == Configured("vLLM", "https://10.0.0.2:8100/v1", identity)
    assert fleet.lmcache_target(node) == Configured(
        "lmcache server", "https://10.0.0.2:8103", identity
    )
    assert fleet.identity(node.tls_name) == TlsIdentity(Path(TLS_DIR), "node-2")  # its feeds


def test_a_local_instance_stays_a_target_without_tls() -> None:
    local = {"name": "here", "base_url": "http://127.0.0.1:8001/v1"}
    fleet = parse_fleet(json.dumps({"instances": [local]}), source="fleet.json")
    here = fleet.instance("here")
    assert fleet.vllm_target(here) == Configured("vLLM", "http://127.0.0.1:8001/v1")
    assert fleet.lmcache_target(here) is None
    assert fleet.identity() is None


@pytest.mark.parametrize(
    ("top", "change", "words"),
    [
        ({"tls_dir": None}, {}, '"tls_dir"'),
        ({}, {"tls_name": None}, "needs the instance's tls_name"),
        ({}, {"tls_name": "Node_2"}, "not a DNS name"),
        ({}, {"kv_events": "tls://node-2.example:8101"}, "tls://10.0.0.2:8101"),
        ({}, {"kv_events": "tls://10.0.0.2"}, "tls://10.0.0.2:8101"),
        ({"tls_dir": "fleet-tls"}, {}, "absolute path"),
        ({}, {"kv_events": "tcp://10.0.0.2:8101"}, "GRAPH_KVCACHE_INSECURE_FEED_HOSTS"),
    ],
)
def test_a_cross_host_entry_that_cannot_work_is_refused_with_the_fix(
    top: dict[str, Any], change: dict[str, Any], words: str
) -> None:
    raw = {"tls_dir": TLS_DIR, "instances": [entry(**change)]} | top
    with pytest.raises(ConfigError) as caught:
        parse_fleet(json.dumps(raw), source="fleet.json")
    assert words in str(caught.value)


def test_plain_tcp_to_another_host_is_allowed_only_when_listed_for_feeds() -> None:
    raw = {"instances": [entry(kv_events="tcp://10.0.0.2:8101", kv_events_replay=None)]}
    fleet = parse_fleet(json.dumps(raw), source="f", feed_hosts=("10.0.0.2",))
    assert fleet.instance("node-2").kv_events == "tcp://10.0.0.2:8101"


def test_each_tls_feed_gets_an_outbound_tcp_route_checked_against_the_instances_name() -> None:
    fleet = fleet_of(entry(), node(3))
    routes = feed_routes(fleet)
    by_peer = {(str(r.peer_ip), r.peer_port): r for r in routes.outbound}
    assert set(by_peer) == {
        ("10.0.0.2", 8101),
        ("10.0.0.2", 8102),
        ("10.0.0.3", 8101),
        (
            "10.0.0.3",
            8102,
        ),
    }
    assert {r.peer_name for r in by_peer.values()} == {"node-2", "node-3"}
    assert by_peer[("10.0.0.3", 8102)].peer_name == "node-3"
    for endpoint, route in (("tls://10.0.0.2:8101", by_peer[("10.0.0.2", 8101)]),):
        assert route.mode == "tcp" and route.listen_ip == ipaddress.IPv4Address("127.0.0.1")
        assert routes.endpoint(endpoint) == f"tcp://127.0.0.1:{route.listen_port}"
    ports = [r.listen_port for r in routes.outbound]
    assert len(set(ports)) == 4
    assert all(FEED_PORT_BASE <= p < FEED_PORT_BASE + FEED_PORT_SPAN for p in ports)
    EdgeRoutes(outbound=list(routes.outbound))  # a valid edge: no two on one listener


def test_the_routes_follow_from_what_they_reach_not_from_the_files_order() -> None:
    second = {**node(3), "kv_events_replay": None}
    forward = feed_routes(fleet_of(entry(), second))
    backward = feed_routes(fleet_of(second, entry()))
    assert forward.local == backward.local
    assert set(forward.outbound) == set(backward.outbound)


def test_local_feeds_need_no_route_and_are_read_where_the_file_says() -> None:
    local = {
        "name": "here",
        "base_url": "http://127.0.0.1:8001/v1",
        "kv_events": "tcp://127.0.0.1:5557",
    }
    routes = feed_routes(parse_fleet(json.dumps({"instances": [local]}), source="f"))
    assert routes.outbound == ()
    assert routes.endpoint("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5557"


def test_a_nodes_server_is_looked_up_under_the_loopback_address_it_advertises() -> None:
    assert registered_ips("10.254.7.2") == ("10.254.7.2", "127.254.7.2")
    assert registered_ips("127.0.0.1") == ("127.0.0.1",)
    assert registered_ips("node-2") == ("node-2",)
