"""`bind_refusal`: why a listener could not bind an address now (what `--listen` is checked
with before anything starts)."""

from __future__ import annotations

import socket

from graph_kvcache_mcp.connectors.processes.ports import bind_refusal, free_port


def test_a_port_another_listener_holds_is_in_use() -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        assert bind_refusal("127.0.0.1", port) == f"127.0.0.1:{port} is in use by another listener"


def test_an_address_no_interface_holds_is_not_this_hosts() -> None:
    refusal = bind_refusal("10.254.254.254", free_port())
    assert refusal == "10.254.254.254 is not an address of this host"


def test_a_free_port_on_an_address_of_this_host_can_be_bound() -> None:
    assert bind_refusal("127.0.0.1", free_port()) is None
