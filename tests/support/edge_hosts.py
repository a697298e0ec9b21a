"""A store and a node as network namespaces, with the store's engine reachable from the node
only through both edges (HTTP mode, mutual TLS): what `test_edge_netns.py` checks and
`tools/bench_edge.py --netns` measures. Everything is started with our CLI inside each
namespace and stopped on exit, by the same CLI; the namespaces are removed after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.fleet_tls import FleetTls, make_fleet_tls
from tests.support.netns import CLI, Host, two_hosts

EDGE_PORT = 9443
"""The store edge's inbound port on the store's address."""
LOCAL_PORT = 19130
"""The node edge's outbound port on the node's loopback (to the store's edge)."""


@dataclass(frozen=True)
class EdgeHosts:
    store: Host
    node: Host
    tls: FleetTls
    engine_port: int
    """The engine's port on the store's loopback."""
    token_file: Path
    """The engine's token (0600)."""

    @property
    def node_url(self) -> str:
        """The engine as the node's clients reach it: through the node's edge."""
        return f"http://127.0.0.1:{LOCAL_PORT}"


@contextmanager
def engine_behind_edges(root: Path) -> Iterator[EdgeHosts]:
    """Two namespaces; the store's managed engine (memory backend) and edge, the node's edge;
    data dirs and TLS material under `root`."""
    with two_hosts() as (store, node):
        tls = make_fleet_tls(root / "tls", store.address, node.address)
        store_dir, node_dir = root / "store", root / "node"
        try:
            engine = store.cli("engine", "start", "--backend", "memory", "--data-dir", store_dir)
            store.cli(
                *("edge", "start", "--data-dir", store_dir, "--tls-dir", tls.store),
                *("--inbound", f"http:{store.address}:{EDGE_PORT}>{engine['port']}"),
            )
            node.cli(
                *("edge", "start", "--data-dir", node_dir, "--tls-dir", tls.node),
                *("--outbound", f"http:{LOCAL_PORT}>{store.address}:{EDGE_PORT}@store"),
            )
            port = engine["port"]
            assert isinstance(port, int), engine
            yield EdgeHosts(store, node, tls, port, store_dir / "engine" / "token")
        finally:
            for host, data_dir, verb in (
                (node, node_dir, "edge"),
                (store, store_dir, "edge"),
                (store, store_dir, "engine"),
            ):
                host.run([*CLI, verb, "stop", "--data-dir", str(data_dir)], check=False)
