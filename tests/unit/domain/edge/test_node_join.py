"""A node's join plan: its edge's routes, the children's loopback URLs, the advertised address,
the fleet entry, and the flags refused with their fix."""

from __future__ import annotations

import json

import pytest

from graph_kvcache_mcp.domain.edge.haproxy import render
from graph_kvcache_mcp.domain.edge.node_join import (
    NodeJoinRequest,
    plan_node_join,
)
from graph_kvcache_mcp.domain.edge.store import advertised_loopback
from graph_kvcache_mcp.domain.fleet.fleet_file import FleetInstance, parse_fleet
from graph_kvcache_mcp.errors import InvalidValue
from tests.unit.domain.edge.test_routes import FILES

SOCKETS = ("/d/vllm/kv-events.sock", "/d/vllm/kv-replay.sock")
NODE = NodeJoinRequest(
    listen="10.0.0.2:8443",
    tls=True,
    certificate_name="node-2",
    certificate_ips=("10.0.0.2",),
    engine_url="https://10.0.0.1:9443",
    engine_token=True,
    coordinator="https://10.0.0.1:9444",
    store_name="store",
    vllm_port=8000,
    kv_connector="mp_native",
    kv_events=True,
    event_sockets=SOCKETS,
    api_key_set=True,
)


def _node(**changes: object) -> NodeJoinRequest:
    return NODE.model_copy(update=changes)


def test_a_full_node_publishes_four_ports_and_reaches_the_store_on_loopback() -> None:
    plan = plan_node_join(NODE)
    assert plan.routes is not None
    inbound = {r.listen_port: (r.mode, r.target, r.client_certificate) for r in plan.routes.inbound}
    assert inbound == {
        8443: ("http", "127.0.0.1:8000", "none"),
        8444: ("tcp", "unix@/d/vllm/kv-events.sock", "required"),
        8445: ("tcp", "unix@/d/vllm/kv-replay.sock", "required"),
        8446: ("http", "127.0.0.1:8446", "required"),
    }
    assert {str(r.listen_ip) for r in plan.routes.inbound} == {"10.0.0.2"}
    outbound = [
        (str(r.listen_ip), r.listen_port, str(r.peer_ip), r.peer_port, r.peer_name)
        for r in plan.routes.outbound
    ]
    assert outbound == [
        ("127.0.0.1", 9443, "10.0.0.1", 9443, "store"),
        ("127.0.0.1", 9444, "10.0.0.1", 9444, "store"),
    ]
    assert plan.engine is not None and plan.engine.local_url == "http://127.0.0.1:9443"
    assert plan.coordinator is not None and plan.coordinator.local_url == "http://127.0.0.1:9444"
    assert (plan.advertise_ip, plan.lmcache_http_port) == ("127.0.0.2", 8446)
    assert plan.coordinator_node == "node-2@10.0.0.2:8446"
    # the default of every inbound route but vLLM's API is still mutual TLS, in haproxy too
    text = render(plan.routes, FILES)
    assert text.count("verify required\n") == 3
    assert text.count("verify none\n") == 1


def test_the_fleet_entry_has_the_contract_shape_with_real_ports() -> None:
    entry = plan_node_join(NODE).fleet_entry
    assert entry is not None
    assert entry.model_dump(exclude_none=True) == {
        "name": "node-2",
        "tls_name": "node-2",
        "base_url": "https://10.0.0.2:8443/v1",
        "api_key_env": "VLLM_API_KEY",
        "kv_events": "tls://10.0.0.2:8444",
        "kv_events_replay": "tls://10.0.0.2:8445",
        "lmcache_http_url": "https://10.0.0.2:8446",
    }


def test_the_fleet_entry_is_read_by_the_fleet_file_parser() -> None:
    """The parser that reads `tls_name`, `tls_dir` and `tls://` feeds is the operator's (#37
    item 5, built in parallel); until it is merged nothing can read the entry, as the skip says."""
    if "tls_name" not in FleetInstance.model_fields:
        pytest.skip("the fleet parser of #37 item 5 (tls_name, tls_dir, tls://) is not merged")
    entry = plan_node_join(NODE).fleet_entry
    assert entry is not None
    text = json.dumps({"tls_dir": "/etc/fleet-tls", "instances": [entry.model_dump()]})
    fleet = parse_fleet(text, source="fleet_entry")
    assert fleet.instances[0].name == "node-2"


def test_an_engine_connector_node_has_no_admin_port_and_no_coordinator() -> None:
    plan = plan_node_join(_node(kv_connector="engine", coordinator=None, kv_events=False))
    assert plan.routes is not None
    assert [r.listen_port for r in plan.routes.inbound] == [8443]
    assert plan.fleet_entry is not None
    assert json.loads(plan.fleet_entry.model_dump_json()) == {
        "name": "node-2",
        "tls_name": "node-2",
        "base_url": "https://10.0.0.2:8443/v1",
        "api_key_env": "VLLM_API_KEY",
    }
    assert (plan.coordinator_node, plan.advertise_ip, plan.lmcache_http_port) == (None, None, None)


def test_the_advertised_address_is_the_nodes_on_loopback() -> None:
    import ipaddress

    assert str(advertised_loopback(ipaddress.IPv4Address("10.203.0.12"))) == "127.203.0.12"
    plan = plan_node_join(_node(listen="192.168.7.9:8443", certificate_ips=("192.168.7.9",)))
    assert plan.advertise_ip == "127.168.7.9"


def test_without_listen_only_the_children_go_through_the_edge() -> None:
    plan = plan_node_join(
        _node(listen=None, coordinator=None, kv_connector="engine", api_key_set=False)
    )
    assert plan.routes is not None and plan.routes.inbound == []
    assert plan.engine is not None and plan.fleet_entry is None


def test_a_plain_http_engine_needs_no_edge() -> None:
    plan = plan_node_join(
        _node(
            listen=None,
            tls=False,
            store_name=None,
            coordinator=None,
            kv_connector="engine",
            engine_url="http://127.0.0.1:9130",
        )
    )
    assert (plan.routes, plan.engine) == (None, None)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tls": False}, r"--listen .* add --tls-dir DIR"),
        ({"store_name": None}, r"needs --store-name"),
        (
            {
                "listen": None,
                "tls": False,
                "store_name": None,
                "coordinator": None,
                "kv_connector": "engine",
            },
            r"--engine-url https://10\.0\.0\.1:9443 .* needs --tls-dir DIR .* and --store-name",
        ),
        (
            {"listen": "10.0.0.3:8443"},
            r"not an address of the node's certificate \(its "
            r"addresses: 10\.0\.0\.2\).*--ip 10\.0\.0\.3",
        ),
        ({"api_key_set": False}, r"never be open without a key: set VLLM_API_KEY"),
        ({"api_key_set": False, "api_key_env": "NODE_KEY"}, r"set NODE_KEY"),
        ({"listen": "10.0.0.2"}, r"--listen '10\.0\.0\.2': give the node's IPv4 address"),
        ({"listen": "127.0.0.1:8443"}, r"not loopback"),
        ({"listen": "10.0.0.2:65534"}, r"the port must be 1-65532"),
        ({"kv_connector": "engine"}, r"--coordinator joins .* use --kv-connector mp_native"),
        ({"coordinator": None, "kv_connector": "none"}, r"use --kv-connector engine or mp_native"),
        ({"engine_url": None, "coordinator": None}, r"--engine-token-file .* give --engine-url"),
        ({"engine_url": "https://store.example:9443"}, r"by its IPv4 address"),
        ({"engine_url": "https://10.0.0.1:9443/kv"}, r"no path"),
        ({"coordinator": "https://10.0.0.1:9443"}, r"the same port of the store"),
        ({"listen": None, "api_key_set": False}, r"add --listen N:P"),
        ({"api_key_env": "NODE-KEY"}, r"not an environment variable name"),
        ({"vllm_port": 9443}, r"port 9443 is also vLLM's --port .* choose another --port"),
        ({"listen": "10.0.0.2:9441"}, r"port 9444 is also the lmcache server's admin port P\+3"),
        ({"lmcache_http_port": 8080}, r"--lmcache-http-port 8080: .* P\+3 \(8446\)"),
    ],
)
def test_flags_that_cannot_work_are_refused_with_the_fix(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidValue, match=message):
        plan_node_join(_node(**changes))
