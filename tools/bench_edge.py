"""Benchmark the fleet edge: the engine's `/kv` direct vs through two edges (mutual TLS).

One managed engine (memory backend), a fleet PKI made by the project's own code, a store edge
(inbound, to the engine) and a node edge (outbound, to the store's edge) on loopback, in HTTP
mode (pooled TLS between the edges, the default for HTTP hops) and in TCP mode (a raw tunnel: a
TLS handshake per request, since the engine's client opens one connection per request). The
client is the project's `SyncKvClient`. Direct and tunnelled calls are interleaved in blocks, so
the ratios come from one run under the same load. Usage:
`.venv/bin/python tools/bench_edge.py [--ops N] [--blocks B]`. Needs haproxy and the `engine`
extra.

On loopback the edges cost what TLS and haproxy cost, with no network round trip: across hosts
a pooled connection saves the round trips a handshake per request would add.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from graph_kvcache_mcp.connectors.edge.process import ManagedEdge
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.files import pki
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.edge.pki import HostRequest
from graph_kvcache_mcp.domain.edge.routes import routes_of
from graph_kvcache_mcp.domain.outcomes import Hit

SMALL = 4 * 1024
LARGE = 1024 * 1024


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def start_edges(root: Path, engine_port: int, mode: str) -> tuple[list[ManagedEdge], int]:
    """A store edge in front of the engine and a node edge to it; the node's local port."""
    now = datetime.now(UTC)
    if not (root / "pki" / "ca.key").exists():
        pki.init_ca(root / "pki", now=now)
        for name in ("store", "node"):
            pki.issue(root / "pki", HostRequest.of(name, ["127.0.0.1"]), root / name, now=now)
    inbound, outbound = free_port(), free_port()
    store, node = ManagedEdge(root / f"store-{mode}"), ManagedEdge(root / f"node-{mode}")
    store.start(routes_of([f"{mode}:127.0.0.1:{inbound}>{engine_port}"], []), root / "store")
    node.start(routes_of([], [f"{mode}:{outbound}>127.0.0.1:{inbound}@store"]), root / "node")
    return [node, store], outbound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100, help="operations per block and path")
    parser.add_argument("--blocks", type=int, default=5, help="interleaved blocks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-edge-") as tmp:
        root = Path(tmp)
        engine = ManagedEngine(root / "engine")
        engine.start(backend="memory")
        edges: list[ManagedEdge] = []
        try:
            state = engine.running_state()
            assert state is not None
            paths = {"direct": state.base_url}
            for mode in ("http", "tcp"):
                started, port = start_edges(root, state.port, mode)
                edges += started
                paths[f"edges, {mode} mode"] = f"http://127.0.0.1:{port}"
            run(paths, engine, args.ops, args.blocks)
        finally:
            for edge in edges:
                edge.stop(term_wait_s=5)
            engine.stop(term_wait_s=5)


def run(paths: dict[str, str], engine: ManagedEngine, ops: int, blocks: int) -> None:
    token = engine.token()
    clients = {name: SyncKvClient(url, token, timeout_s=10) for name, url in paths.items()}
    small, large = f"bench/{os.urandom(4).hex()}/s", f"bench/{os.urandom(4).hex()}/l"
    direct = clients["direct"]
    value = os.urandom(LARGE)
    direct.put(small, os.urandom(SMALL))
    direct.put(large, value)
    for name, client in clients.items():  # each path answers, byte-exact, before it is timed
        got = client.get(large)
        assert isinstance(got, Hit) and got.value == value, f"{name}: {got}"
    cells: dict[tuple[str, str], list[float]] = {}
    for _ in range(blocks):
        for name, client in clients.items():
            for label, call in (
                ("HEAD 4 KiB", lambda c=client: c.contains(small)),
                ("GET 1 MiB", lambda c=client: c.get(large)),
            ):
                cells.setdefault((name, label), []).extend(timed(call) for _ in range(ops))
    for client in clients.values():
        client.close()
    print(f"{'path':<20} {'HEAD 4 KiB p50':>18} {'GET 1 MiB p50':>18}   ({blocks} x {ops} each)")
    for name in clients:
        row = []
        for label in ("HEAD 4 KiB", "GET 1 MiB"):
            p50 = p50_ms(cells[(name, label)])
            ratio = p50 / p50_ms(cells[("direct", label)])
            row.append(f"{p50:7.2f} ms {ratio:5.2f}x")
        print(f"{name:<20} {row[0]:>18} {row[1]:>18}")


if __name__ == "__main__":
    main()
