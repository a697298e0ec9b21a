"""The host's managed edge (real haproxy) carrying the real engine's `/kv` between two edges
with mutual TLS: byte-exact, refusing outsiders, rotating without a drop, stopping clean."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import zmq
from pydantic import SecretStr

from graph_kvcache_mcp.connectors.edge import haproxy
from graph_kvcache_mcp.connectors.edge.process import ManagedEdge
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.processes.identity import listener_owner
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.edge.routes import routes_of
from graph_kvcache_mcp.domain.outcomes import Hit, Stored, Unavailable
from graph_kvcache_mcp.errors import EdgeProcessError
from tests.support.engines import RunningEngine
from tests.support.fleet_tls import (
    FleetTls,
    client_context,
    http_exchange,
    impostor,
    make_fleet_tls,
    refused,
    require_haproxy,
    served_serial,
    tls_connection,
)


@pytest.fixture
def tls(tmp_path: Path) -> FleetTls:
    require_haproxy()
    return make_fleet_tls(tmp_path / "tls")


@contextmanager
def edge_pair(
    root: Path, store_tls: Path, node_tls: Path, *, mode: str, target_port: int
) -> Iterator[tuple[ManagedEdge, int, ManagedEdge, int]]:
    """A store's edge (inbound, to `target_port`) and a node's (outbound, to the store's edge,
    expecting the name "store"), stopped on exit: (store, its port, node, its local port)."""
    inbound_port, outbound_port = free_port(), free_port()
    store = ManagedEdge(root / "store")
    node = ManagedEdge(root / "node")
    try:
        store.start(routes_of([f"{mode}:127.0.0.1:{inbound_port}>{target_port}"], []), store_tls)
        outbound = f"{mode}:{outbound_port}>127.0.0.1:{inbound_port}@store"
        node.start(routes_of([], [outbound]), node_tls)
        yield store, inbound_port, node, outbound_port
    finally:
        node.stop(term_wait_s=5)
        store.stop(term_wait_s=5)


@pytest.fixture
def edges(
    tmp_path: Path, tls: FleetTls, memory_engine: RunningEngine
) -> Iterator[tuple[ManagedEdge, int, ManagedEdge, int]]:
    """The store's edge in front of the engine, and a node's edge to it (HTTP mode)."""
    engine_port = int(memory_engine.base_url.rsplit(":", 1)[1])
    with edge_pair(tmp_path, tls.store, tls.node, mode="http", target_port=engine_port) as pair:
        yield pair


def test_kv_put_and_get_are_byte_exact_through_both_edges(
    edges: tuple[ManagedEdge, int, ManagedEdge, int], memory_engine: RunningEngine
) -> None:
    _, _, _, outbound_port = edges
    value = os.urandom(1024 * 1024 + 7)
    run = os.urandom(4).hex()  # the engine keeps a key's first value: fresh keys per run
    keys = [f"edge/{run}/{k}" for k in ("plain", '"quoted"<>', "%zz%41", "x/../y", "a//b")]
    # a bound, not a race: the machine is shared and loaded
    with SyncKvClient(
        f"http://127.0.0.1:{outbound_port}", memory_engine.token, timeout_s=30
    ) as client:
        for key in keys:
            assert isinstance(client.put(key, value + key.encode()), Stored)
        for key in keys:
            got = client.get(key)
            assert isinstance(got, Hit) and got.value == value + key.encode()
    with memory_engine.sync_client() as direct:
        got = direct.get(keys[1])
        assert isinstance(got, Hit) and got.value == value + keys[1].encode()


def test_a_client_without_a_fleet_certificate_is_refused_at_the_inbound_listener(
    edges: tuple[ManagedEdge, int, ManagedEdge, int], tls: FleetTls
) -> None:
    _, inbound_port, _, _ = edges
    assert refused(inbound_port, client_context(tls.node, tls.node)) is None  # the control
    assert refused(inbound_port, client_context(None, tls.node)) is not None
    assert refused(inbound_port, client_context(tls.rogue, tls.node)) is not None


def test_the_outbound_edge_passes_nothing_from_a_peer_of_another_ca(
    tmp_path: Path, tls: FleetTls
) -> None:
    with impostor(tls.rogue) as impostor_port:
        outbound_port = free_port()
        node = ManagedEdge(tmp_path / "node")
        try:
            outbound = f"http:{outbound_port}>127.0.0.1:{impostor_port}@store"
            node.start(routes_of([], [outbound]), tls.node)
            got = _get_through(outbound_port)
        finally:
            node.stop(term_wait_s=5)
    assert isinstance(got, Unavailable), got


def test_the_outbound_edge_refuses_a_fleet_peer_with_another_name(
    tmp_path: Path, tls: FleetTls, memory_engine: RunningEngine
) -> None:
    engine_port = int(memory_engine.base_url.rsplit(":", 1)[1])
    # the node's own certificate (fleet CA, name "node") in front of the engine, asked for "store"
    with edge_pair(tmp_path, tls.node, tls.node, mode="http", target_port=engine_port) as pair:
        got = _get_through(pair[3], memory_engine.token)  # the engine would answer a Miss
    assert isinstance(got, Unavailable), got


WRONG_TOKEN = SecretStr("not-the-engine-token")


def _get_through(port: int, token: SecretStr = WRONG_TOKEN) -> object:
    with SyncKvClient(f"http://127.0.0.1:{port}", token) as client:
        return client.get("edge/never-stored")


def test_rotate_serves_a_new_serial_without_dropping_a_live_connection(
    edges: tuple[ManagedEdge, int, ManagedEdge, int], tls: FleetTls
) -> None:
    store, inbound_port, _, _ = edges
    context = client_context(tls.node, tls.node)
    before = served_serial(inbound_port, context)
    with tls_connection(inbound_port, context) as live:
        assert http_exchange(live, "/kv/stats").startswith(b"HTTP/1.1 ")
        rotated = store.rotate(tls.store_next)
        assert http_exchange(live, "/kv/stats").startswith(b"HTTP/1.1 ")  # still up
    after = served_serial(inbound_port, context)
    assert rotated.previous_serial == before
    assert rotated.served_serial == after == rotated.certificate.serial != before
    status = store.status()
    assert status.served_serial == after
    assert status.certificate is not None and status.certificate.serial == after


def test_rotate_refuses_a_certificate_of_another_ca(
    edges: tuple[ManagedEdge, int, ManagedEdge, int], tls: FleetTls
) -> None:
    store = edges[0]
    before = store.status().served_serial
    with pytest.raises(EdgeProcessError, match="another CA"):
        store.rotate(tls.rogue)
    assert store.status().served_serial == before


def test_stop_leaves_nothing_running_and_frees_every_port(tmp_path: Path, tls: FleetTls) -> None:
    port = free_port()
    edge = ManagedEdge(tmp_path / "edge")
    status = edge.start(routes_of([f"tcp:127.0.0.1:{port}>{free_port()}"], []), tls.store)
    assert status.reachable and status.pid is not None
    members = [status.pid, *(c.pid for c in psutil.Process(status.pid).children(recursive=True))]
    assert len(members) >= 2  # master and worker
    assert edge.stop(term_wait_s=5).how == "terminated"
    for pid in members:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert listener_owner(-1, port) == "none"
    assert not edge.status().running
    assert not (tmp_path / "edge" / "edge" / "stats.sock").exists()


def test_an_edge_killed_without_stop_is_reported_gone_with_the_routes_it_carried(
    tmp_path: Path, tls: FleetTls
) -> None:
    route = f"http:127.0.0.1:{free_port()}>127.0.0.1:{free_port()}"  # as a spec renders it
    edge = ManagedEdge(tmp_path / "edge")
    started = edge.start(routes_of([route], []), tls.store)
    assert started.pid is not None
    os.kill(started.pid, signal.SIGKILL)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(started.pid).wait(timeout=30)
    status = edge.status()
    assert not status.running
    assert status.reason is not None
    assert f"(pid {started.pid}) is gone without `edge stop`" in status.reason
    assert route in status.reason and "engine start --listen" in status.reason
    assert edge.status().reason == status.reason  # every reader is told, until a stop or start
    assert edge.stop(term_wait_s=5).how == "not_running"
    assert "no managed edge runs" in (edge.status().reason or "")
    assert edge.start(routes_of([route], []), tls.store).reachable
    assert edge.stop(term_wait_s=5).how == "terminated"


def test_a_taken_listener_port_fails_the_start_naming_it(tmp_path: Path, tls: FleetTls) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        edge = ManagedEdge(tmp_path / "edge")
        with pytest.raises(EdgeProcessError, match=f"port {port} is already in use"):
            edge.start(routes_of([f"http:127.0.0.1:{port}>1"], []), tls.store)
    assert not edge.status().running


def test_a_listener_on_another_address_of_the_port_is_no_rival(
    tmp_path: Path, tls: FleetTls
) -> None:
    with socket.socket() as neighbour:  # 127.0.0.2:PORT, held by this test process
        neighbour.bind(("127.0.0.2", 0))
        neighbour.listen()
        port = neighbour.getsockname()[1]
        edge = ManagedEdge(tmp_path / "edge")
        try:
            status = edge.start(routes_of([f"tcp:127.0.0.1:{port}>1"], []), tls.store)
            assert status.reachable, status.reason
            assert edge.status().reachable
        finally:
            edge.stop(term_wait_s=5)


def test_missing_haproxy_is_refused_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(haproxy, "_SBIN", ())
    with pytest.raises(EdgeProcessError, match="apt-get install -y haproxy"):
        haproxy.haproxy_binary()


def test_a_zmq_feed_through_tcp_routes_loses_nothing_across_a_rotation(
    tmp_path: Path, tls: FleetTls
) -> None:
    publisher_port = free_port()
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    subscriber = context.socket(zmq.SUB)
    try:
        publisher.bind(f"tcp://127.0.0.1:{publisher_port}")
        # the feed's host is the "store" here: its edge forwards to the PUB
        with edge_pair(tmp_path, tls.store, tls.node, mode="tcp", target_port=publisher_port) as (
            store,
            _,
            _,
            outbound_port,
        ):
            subscriber.setsockopt(zmq.SUBSCRIBE, b"")
            subscriber.setsockopt(zmq.RCVTIMEO, 200)
            subscriber.connect(f"tcp://127.0.0.1:{outbound_port}")
            _until_subscribed(publisher, subscriber)
            got = _send_and_receive(publisher, subscriber, range(100))
            store.rotate(tls.store_next)
            got += _send_and_receive(publisher, subscriber, range(100, 200))
        assert got == [str(i).encode() for i in range(200)]
    finally:
        subscriber.close(linger=0)
        publisher.close(linger=0)
        context.term()


def _until_subscribed(publisher: zmq.Socket[bytes], subscriber: zmq.Socket[bytes]) -> None:
    """PUB drops what it sends before the subscription arrives: probe until one gets through."""
    for _ in range(100):  # a bound, not a race: 100 x 200 ms
        publisher.send(b"probe")
        try:
            if subscriber.recv() == b"probe":
                break
        except zmq.Again:
            continue
    else:
        pytest.fail("the subscription never reached the publisher through the edges")
    while True:  # drain the probes still in flight
        try:
            subscriber.recv()
        except zmq.Again:
            return


def _send_and_receive(
    publisher: zmq.Socket[bytes], subscriber: zmq.Socket[bytes], numbers: range
) -> list[bytes]:
    for number in numbers:
        publisher.send(str(number).encode())
    received = []
    for _ in numbers:
        try:
            received.append(subscriber.recv())
        except zmq.Again:
            break
    return received


def test_an_address_not_on_this_host_fails_the_start_quoting_haproxy(
    tmp_path: Path, tls: FleetTls
) -> None:
    edge = ManagedEdge(tmp_path / "edge")
    with pytest.raises(EdgeProcessError, match=r"cannot bind socket .* for \[192\.0\.2\.1:"):
        edge.start(routes_of([f"http:192.0.2.1:{free_port()}>1"], []), tls.store)  # TEST-NET-1
    assert not edge.status().running
