"""Benchmark the LMCache L2 client: ours vs the peer `RemoteKVL2Connector`, one 64-key batch.

Both are driven exactly as LMCache's `native_plugin` adapter drives them: `submit_batch_set` of
64 pages of 256 KiB, wait on the eventfd, drain; then `submit_batch_get` of the same keys into
64 buffers. Same managed engine (memory backend), same run; each round uses fresh keys and
alternates which client goes first. Bytes are verified after every get (outside the timing).
Figures are the median of R rounds (best in brackets), in keys per second.
Usage: `.venv/bin/python tools/bench_l2.py [--rounds 9] [--keys 64] [--page-kib 256]`.
Needs the `engine` and `bench` extras (epistemic-graph-server, epistemic-graph 2.27.7).
Goal: ours >= 2x the peer for both set and get.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from epistemic_graph.kvcache import RemoteKVL2Connector

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.plugins.lmcache.l2 import EngineL2Client

GOAL = 2.0


class NativeClient(Protocol):
    def event_fd(self) -> int: ...
    def submit_batch_set(self, keys: list[str], memoryviews: list[Any]) -> int: ...
    def submit_batch_get(self, keys: list[str], memoryviews: list[Any]) -> int: ...
    def drain_completions(self) -> list[tuple[int, bool, str, list[bool] | None]]: ...
    def close(self) -> None: ...


def wait(client: NativeClient, future_id: int, timeout_s: float = 60) -> tuple[bool, str]:
    """Poll the eventfd and drain until `future_id` completes, as LMCache's demux thread does."""
    poller = select.poll()
    poller.register(client.event_fd(), select.POLLIN)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if poller.poll(500):
            for done_id, ok, error, _ in client.drain_completions():
                if done_id == future_id:
                    return ok, error
    raise TimeoutError(f"batch {future_id} did not complete within {timeout_s} s")


def one_round(client: NativeClient, tag: str, keys: int, page: int) -> tuple[float, float]:
    names = [f"Qwen/Qwen3-8B@01000100@0@{tag}{index:056x}" for index in range(keys)]
    pages = [os.urandom(page) for _ in names]
    started = time.perf_counter()
    ok, error = wait(client, client.submit_batch_set(names, [memoryview(p) for p in pages]))
    set_s = time.perf_counter() - started
    if not ok:
        raise RuntimeError(f"set failed: {error}")
    buffers = [bytearray(page) for _ in names]
    started = time.perf_counter()
    ok, error = wait(client, client.submit_batch_get(names, [memoryview(b) for b in buffers]))
    get_s = time.perf_counter() - started
    if not ok or any(bytes(b) != p for b, p in zip(buffers, pages, strict=True)):
        raise RuntimeError(f"get did not return the stored bytes ({error})")
    return keys / set_s, keys / get_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--page-kib", type=int, default=256)
    args = parser.parse_args()
    page = args.page_kib * 1024

    with tempfile.TemporaryDirectory() as tmp:
        engine = ManagedEngine(Path(tmp))
        engine.start(backend="memory")
        state = engine.running_state()
        assert state is not None
        token = engine.token().get_secret_value()
        makers: dict[str, Callable[[], NativeClient]] = {
            "ours EngineL2Client": lambda: EngineL2Client(base_url=state.base_url, token=token),
            "peer RemoteKVL2Connector": lambda: RemoteKVL2Connector(
                base_url=state.base_url, token=token
            ),
        }
        clients = {name: make() for name, make in makers.items()}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
        try:
            for name, client in clients.items():  # warm-up: imports, pools, first connections
                one_round(client, f"w{name[:4]}", 4, page)
            for round_index in range(args.rounds):
                order = list(clients) if round_index % 2 == 0 else list(reversed(clients))
                for name in order:
                    tag = f"r{round_index}{name[:4]}"
                    results[name].append(one_round(clients[name], tag, args.keys, page))
        finally:
            for client in clients.values():
                client.close()
            engine.stop()
    print_table(results, args.keys, args.page_kib, args.rounds)


def print_table(
    results: dict[str, list[tuple[float, float]]], keys: int, page_kib: int, rounds: int
) -> None:
    print(
        f"LMCache L2 native client, one batch of {keys} x {page_kib} KiB, memory backend; "
        f"median of {rounds} rounds [best], keys/s"
    )
    print(f"{'client':<28}{'set':>16}{'get':>16}{'set MB/s':>10}{'get MB/s':>10}")
    medians: dict[str, tuple[float, float]] = {}
    for name, rows in results.items():
        sets, gets = [r[0] for r in rows], [r[1] for r in rows]
        medians[name] = (statistics.median(sets), statistics.median(gets))
        set_m, get_m = medians[name]
        print(
            f"{name:<28}{set_m:>8.0f} [{max(sets):>5.0f}]{get_m:>8.0f} [{max(gets):>5.0f}]"
            f"{set_m * page_kib / 1024:>10.0f}{get_m * page_kib / 1024:>10.0f}"
        )
    ours, peer = medians["ours EngineL2Client"], medians["peer RemoteKVL2Connector"]
    print()
    print(f"{'ratio (median / median)':<40}{'value':>8}{'goal':>8}")
    for label, index in (("set: ours / peer", 0), ("get: ours / peer", 1)):
        ratio = ours[index] / peer[index]
        verdict = "ok" if ratio >= GOAL else "BELOW GOAL"
        print(f"{label:<40}{ratio:>7.2f}x{GOAL:>7.1f}x {verdict}")


if __name__ == "__main__":
    main()
