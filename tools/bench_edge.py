"""Benchmark the fleet edge: the engine's `/kv` through two edges (mutual TLS) vs a baseline.

Loopback (the default): one managed engine (memory backend), a fleet PKI made by the project's
own code, a store edge (inbound, to the engine) and a node edge (outbound, to the store's edge)
on loopback, in HTTP mode (pooled TLS between the edges, the default for HTTP hops) and in TCP
mode (a raw tunnel: a TLS handshake per request, since the engine's client opens one connection
per request), each against the engine reached directly.

`--netns` (root only): the store and the node as two network namespaces joined by a veth pair
(`tests/support/netns.py`), the engine and the store's edge in the store's, the node's edge and
the client in the node's. The baseline is the same engine over the namespaces' plain TCP: the
engine refuses any non-loopback listener, so the benchmark starts a plain haproxy (`mode tcp`,
no TLS) on the store's address in front of it, a byte splice that stands in for the engine
listening there itself; both paths cross the same link to the same engine, and both pay one
loopback connection to it on the store. A plain `mode http` forwarder is printed too (what
haproxy's HTTP parsing costs without TLS).

The client is the project's `SyncKvClient`; the paths are interleaved in blocks, so the ratios
come from one run under the same load. Usage: `.venv/bin/python tools/bench_edge.py [--netns]
[--ops N] [--blocks B]`. Needs haproxy and the `engine` extra.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import SecretStr

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graph_kvcache_mcp.connectors.edge.haproxy import (  # noqa: E402
    haproxy_binary,
    notify_socket,
    wait_notified_ready,
)
from graph_kvcache_mcp.connectors.edge.process import ManagedEdge  # noqa: E402
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient  # noqa: E402
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine  # noqa: E402
from graph_kvcache_mcp.connectors.files.private import secret_file  # noqa: E402
from graph_kvcache_mcp.connectors.processes.ports import free_port  # noqa: E402
from graph_kvcache_mcp.domain.edge import haproxy as edge_config  # noqa: E402
from graph_kvcache_mcp.domain.edge.routes import routes_of  # noqa: E402
from graph_kvcache_mcp.domain.outcomes import Hit  # noqa: E402
from tests.support.edge_hosts import engine_behind_edges  # noqa: E402
from tests.support.fleet_tls import make_fleet_tls  # noqa: E402
from tests.support.netns import Host, netns_unavailable  # noqa: E402

SMALL = 4 * 1024
LARGE = 1024 * 1024
OPERATIONS = ("HEAD 4 KiB", "GET 1 MiB")
PLAIN_TCP_PORT = 9080
PLAIN_HTTP_PORT = 9081
PLAIN_TCP = "plain TCP"
EDGES_HTTP = "edges, http mode"


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def p95_ms(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[18] * 1000


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


# --- loopback ---------------------------------------------------------------------------------


def start_edges(root: Path, engine_port: int, mode: str) -> tuple[list[ManagedEdge], int]:
    """A store edge in front of the engine and a node edge to it; the node's local port."""
    tls = root / "tls"
    if not tls.exists():
        make_fleet_tls(tls)
    inbound, outbound = free_port(), free_port()
    store, node = ManagedEdge(root / f"store-{mode}"), ManagedEdge(root / f"node-{mode}")
    store.start(routes_of([f"{mode}:127.0.0.1:{inbound}>{engine_port}"], []), tls / "store")
    node.start(routes_of([], [f"{mode}:{outbound}>127.0.0.1:{inbound}@store"]), tls / "node")
    return [node, store], outbound


def bench_loopback(ops: int, blocks: int) -> None:
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
            print(f"loopback; load average before: {load_average()}")
            measure(paths, engine.token(), ops=ops, blocks=blocks, baseline="direct")
            print(f"load average after: {load_average()}")
        finally:
            for edge in edges:
                edge.stop(term_wait_s=5)
            engine.stop(term_wait_s=5)


# --- network namespaces -----------------------------------------------------------------------


def plain_forwarder_config(listen_ip: str, engine_port: int) -> str:
    """A benchmark-only haproxy: the engine on the store's address over plain TCP (and plain
    HTTP), no TLS; the edge's own timeouts and one thread, like the edges."""
    return "\n".join(
        [
            "global",
            "  nbthread 1",
            "defaults",
            f"  timeout connect {edge_config.CONNECT_TIMEOUT}",
            f"  timeout client {edge_config.CLIENT_TIMEOUT}",
            f"  timeout server {edge_config.SERVER_TIMEOUT}",
            f"  timeout http-keep-alive {edge_config.KEEP_ALIVE_TIMEOUT}",
            "listen plain_tcp",
            "  mode tcp",
            f"  bind {listen_ip}:{PLAIN_TCP_PORT}",
            f"  server engine 127.0.0.1:{engine_port}",
            "listen plain_http",
            "  mode http",
            "  http-reuse always",
            f"  bind {listen_ip}:{PLAIN_HTTP_PORT}",
            f"  server engine 127.0.0.1:{engine_port}",
            "",
        ]
    )


@contextmanager
def plain_forwarder(host: Host, engine_port: int, home: Path) -> Iterator[None]:
    """The plain haproxy in `host`'s namespace, ready (its READY=1) until exit; then its
    process group, which this benchmark started, is stopped."""
    home.mkdir(mode=0o700)
    config = home / "plain.cfg"
    config.write_text(plain_forwarder_config(host.address, engine_port))
    argv = ["ip", "netns", "exec", host.namespace, str(haproxy_binary()), "-Ws", "-f", str(config)]
    log = home / "plain.log"
    with notify_socket(home / "notify.sock") as receiver, log.open("wb") as output:
        env = {**os.environ, "NOTIFY_SOCKET": str(home / "notify.sock")}
        process = subprocess.Popen(
            argv, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            why = wait_notified_ready(receiver, process, timeout_s=15)
            assert why is None, f"the plain forwarder: {why}; its log: {log.read_text()[-2000:]}"
            yield
        finally:
            os.killpg(process.pid, 15)
            process.wait(timeout=10)


def bench_netns(ops: int, blocks: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-edge-") as tmp:
        root = Path(tmp)
        with (
            engine_behind_edges(root) as hosts,
            plain_forwarder(hosts.store, hosts.engine_port, root / "plain"),
        ):
            store = hosts.store.address
            paths = {
                PLAIN_TCP: f"http://{store}:{PLAIN_TCP_PORT}",
                "plain HTTP forwarder": f"http://{store}:{PLAIN_HTTP_PORT}",
                EDGES_HTTP: hosts.node_url,
            }
            print(
                f"two network namespaces ({store} store, {hosts.node.address} node); baseline: "
                f"{PLAIN_TCP}, a plain haproxy mode tcp on the store's address in front of the "
                "engine (the engine takes loopback listeners only): the same link and the same "
                "engine, without TLS or the node's edge"
            )
            print(f"load average before: {load_average()}", flush=True)
            argv = [sys.executable, str(Path(__file__).resolve()), "--client"]
            argv += ["--ops", str(ops), "--blocks", str(blocks)]
            argv += ["--token-file", str(hosts.token_file)]
            for name, url in paths.items():
                argv += ["--path", f"{name}={url}"]
            done = subprocess.run(
                ["ip", "netns", "exec", hosts.node.namespace, *argv], timeout=600, check=False
            )
            assert done.returncode == 0, f"the node's client exited with {done.returncode}"
            print(f"load average after: {load_average()}")


# --- measuring (in this process, or in the node's namespace with --client) --------------------


def measure(
    paths: dict[str, str], token: SecretStr, *, ops: int, blocks: int, baseline: str
) -> None:
    """Time HEAD 4 KiB and GET 1 MiB on every path, interleaved in blocks; print p50 and p95
    per path and each as a ratio to `baseline`'s."""
    clients = {name: SyncKvClient(url, token, timeout_s=10) for name, url in paths.items()}
    small, large = f"bench/{os.urandom(4).hex()}/s", f"bench/{os.urandom(4).hex()}/l"
    first = clients[baseline]
    value = os.urandom(LARGE)
    first.put(small, os.urandom(SMALL))
    first.put(large, value)
    for name, client in clients.items():  # each path answers, byte-exact, before it is timed
        got = client.get(large)
        assert isinstance(got, Hit) and got.value == value, f"{name}: {got}"
    cells: dict[tuple[str, str], list[float]] = {}
    for _ in range(blocks):
        for name, client in clients.items():
            for label, call in (
                (OPERATIONS[0], lambda c=client: c.contains(small)),
                (OPERATIONS[1], lambda c=client: c.get(large)),
            ):
                cells.setdefault((name, label), []).extend(timed(call) for _ in range(ops))
    for client in clients.values():
        client.close()
    print_table(cells, list(clients), baseline, f"{blocks} x {ops} each")


def print_table(
    cells: dict[tuple[str, str], list[float]], names: list[str], baseline: str, note: str
) -> None:
    heads = [f"{label} p50 / p95" for label in OPERATIONS]
    print(f"{'path':<22} {heads[0]:>36} {heads[1]:>36}   ({note}; ratios to {baseline})")
    for name in names:
        row = []
        for label in OPERATIONS:
            samples, base = cells[(name, label)], cells[(baseline, label)]
            p50, p95 = p50_ms(samples), p95_ms(samples)
            row.append(
                f"{p50:6.2f} / {p95:6.2f} ms "
                f"{p50 / p50_ms(base):5.2f}x / {p95 / p95_ms(base):5.2f}x"
            )
        print(f"{name:<22} {row[0]:>36} {row[1]:>36}")
    if (EDGES_HTTP, OPERATIONS[1]) in cells and baseline == PLAIN_TCP:
        ratio = p50_ms(cells[(EDGES_HTTP, OPERATIONS[1])]) / p50_ms(
            cells[(PLAIN_TCP, OPERATIONS[1])]
        )
        print(f"GET 1 MiB through both edges: {ratio:.2f}x of {PLAIN_TCP} at p50 (goal <= 2x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100, help="operations per block and path")
    parser.add_argument("--blocks", type=int, default=5, help="interleaved blocks")
    parser.add_argument(
        "--netns", action="store_true", help="store and node as network namespaces (root only)"
    )
    # the measuring half of --netns, run inside the node's namespace
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--token-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--path", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        paths = dict(spec.split("=", 1) for spec in args.path)
        token = SecretStr(secret_file(args.token_file) or "")
        measure(paths, token, ops=args.ops, blocks=args.blocks, baseline=next(iter(paths)))
        return 0
    if args.netns:
        if (reason := netns_unavailable()) is not None:
            print(
                f"bench_edge.py --netns refused: {reason}; run it as root, or without --netns "
                "for the loopback figures",
                file=sys.stderr,
            )
            return 2
        bench_netns(args.ops, args.blocks)
        return 0
    bench_loopback(args.ops, args.blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
