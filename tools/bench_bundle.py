"""Benchmark bundle compiles: KV cache hit vs miss (full assembly) with 200 candidate items.

One managed engine (memory backend), everything measured in one run. Each round uses a fresh seed,
so its first compile is a genuine miss (key lookup, scoring, MMR, budget fit, proof graph, encode,
PUT) and its second an exact repeat: a hit (key lookup, GET, checksum, decode). Also shown: the
pure assembly without any store, and the key computation alone (both paths pay it).
Usage: `.venv/bin/python tools/bench_bundle.py [--items 200] [--rounds 30]`. Goal: hit >= 10x
faster than miss. Needs the `engine` extra (epistemic-graph-server).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio

from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.domain.bundle import (
    BundleParams,
    BundleRequest,
    EstimateCounter,
    bundle_key,
    compile_bundle,
)
from graph_kvcache_mcp.domain.bundle.synthetic import QUERY, synthetic_evidence
from graph_kvcache_mcp.domain.latency import percentile
from graph_kvcache_mcp.services.bundle.bundles import BundleCounters, compile_cached

GOAL = 10.0


def make_request(items: int, seed: str) -> BundleRequest:
    return BundleRequest(
        query=QUERY,
        items=tuple(synthetic_evidence(items, seed=seed)),
        params=BundleParams(token_budget=2000, top_k=20, as_of=datetime(2026, 1, 1, tzinfo=UTC)),
    )


async def measure(kv: KvClient, items: int, rounds: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {"miss": [], "hit": [], "assembly only": [], "key only": []}
    counters = BundleCounters()
    warm = make_request(items, "warm-up")
    await compile_cached(warm, kv=kv, counters=counters)  # first-use costs (threads, sockets)
    await compile_cached(warm, kv=kv, counters=counters)
    for _ in range(rounds):
        request = make_request(items, secrets.token_hex(8))
        for case in ("miss", "hit"):
            started = time.perf_counter()
            result = await compile_cached(request, kv=kv, counters=counters)
            timings[case].append(time.perf_counter() - started)
            if result.cache != case:
                raise SystemExit(f"expected a {case}, got {result.cache}: {result.reason}")
        started = time.perf_counter()
        compile_bundle(request)
        timings["assembly only"].append(time.perf_counter() - started)
        started = time.perf_counter()
        bundle_key(request, token_counter=EstimateCounter.name)
        timings["key only"].append(time.perf_counter() - started)
    if counters.assemblies != rounds + 1:
        raise SystemExit(f"hits re-assembled: {counters.assemblies} assemblies")
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bundle-") as tmp:
        engine = ManagedEngine(Path(tmp))
        status = engine.start(backend="memory")
        assert status.base_url is not None
        try:
            kv = KvClient(SyncKvClient(status.base_url, engine.token()))
            timings = anyio.run(measure, kv, args.items, args.rounds)
            anyio.run(kv.aclose)
        finally:
            engine.stop()

    miss = statistics.median(timings["miss"])
    print(f"bundle compile, {args.items} candidate items, {args.rounds} rounds (memory engine)")
    print(f"{'case':<15} {'p50 ms':>9} {'p95 ms':>9} {'vs hit':>8}")
    hit = statistics.median(timings["hit"])
    for case, values in timings.items():
        p50 = statistics.median(values)
        p95 = percentile(values, 95) or 0.0
        print(f"{case:<15} {p50 * 1000:>9.2f} {p95 * 1000:>9.2f} {p50 / hit:>7.1f}x")
    speedup = miss / hit
    verdict = "meets" if speedup >= GOAL else "MISSES"
    print(f"speedup hit vs miss (p50): {speedup:.1f}x ({verdict} the {GOAL:.0f}x goal)")


if __name__ == "__main__":
    main()
