"""Benchmark the KV data path: our client vs a bare http.client loop vs the peer client.

One managed engine (memory backend), 256 KiB blocks, all measured in one run and printed side by
side with ratios. Usage: `.venv/bin/python tools/bench_kv.py [--ops N] [--rounds R]`. Needs the
`engine` and `bench` extras (epistemic-graph-server, epistemic-graph 2.27.7).

Rows:
  sequential  one operation at a time: bare http.client, our sync core, our async client, the peer
  batch       64 blocks: our put_many/get_many (bounded concurrency) vs the peer's one-by-one loop
Each figure is the best of R rounds (ops/s), to damp noise on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import http.client
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
from epistemic_graph.kvcache import KvCacheConfig, RemoteKVConnector

from graph_kvcache_mcp.connectors.engine_process import ManagedEngine
from graph_kvcache_mcp.connectors.kv_http import KvClient, SyncKvClient

BLOCK = 256 * 1024
BATCH = 64


def ops_per_s(count: int, run: Callable[[], None], rounds: int) -> float:
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = max(best, count / (time.perf_counter() - started))
    return best


def bare_http_client(host: str, port: int, token: str) -> tuple[Callable[..., None], ...]:
    headers = {"Authorization": f"Bearer {token}"}

    def put(key: str, value: bytes) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("PUT", f"/kv/{key}", body=value, headers=headers)
        conn.getresponse().read()
        conn.close()

    def get(key: str) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", f"/kv/{key}", headers=headers)
        conn.getresponse().read()
        conn.close()

    return put, get


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=400, help="sequential operations per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ops, rounds = args.ops, args.rounds

    with tempfile.TemporaryDirectory() as tmp:
        engine = ManagedEngine(Path(tmp))
        engine.start(backend="memory")
        state = engine.running_state()
        assert state is not None
        token = engine.token()
        try:
            results = run_all(state.base_url, state.port, token.get_secret_value(), ops, rounds)
        finally:
            engine.stop()
    print_table(results, ops, rounds)


def run_all(base_url: str, port: int, token: str, ops: int, rounds: int) -> dict[str, float]:
    from pydantic import SecretStr

    values = [secrets.token_bytes(BLOCK) for _ in range(8)]
    sync = SyncKvClient(base_url, SecretStr(token), timeout_s=10, concurrency=8)
    async_client = KvClient(sync)
    peer = RemoteKVConnector(KvCacheConfig(base_url=base_url, token=token, timeout_s=10))
    bare_put, bare_get = bare_http_client("127.0.0.1", port, token)
    results: dict[str, float] = {}

    def seq(prefix: str, op: Callable[[str, bytes], object]) -> Callable[[], None]:
        def run() -> None:
            tag = secrets.token_hex(4)
            for i in range(ops):
                op(f"{prefix}:{tag}:{i}", values[i % 8])

        return run

    def seq_get(op: Callable[[str], object], keys: list[str]) -> Callable[[], None]:
        def run() -> None:
            for key in keys:
                op(key)

        return run

    read_keys = [f"read:{i}" for i in range(ops)]
    sync.put_many([(k, values[i % 8]) for i, k in enumerate(read_keys)])

    def async_put_loop() -> None:
        async def go() -> None:
            tag = secrets.token_hex(4)
            for i in range(ops):
                await async_client.put(f"ap:{tag}:{i}", values[i % 8])

        anyio.run(go)

    def async_get_loop() -> None:
        async def go() -> None:
            for key in read_keys:
                await async_client.get(key)

        anyio.run(go)

    results["put bare http.client"] = ops_per_s(ops, seq("bp", bare_put), rounds)
    results["put ours (sync core)"] = ops_per_s(ops, seq("sp", sync.put), rounds)
    results["put ours (async)"] = ops_per_s(ops, async_put_loop, rounds)
    results["put peer RemoteKVConnector"] = ops_per_s(ops, seq("pp", peer.put), rounds)
    results["get bare http.client"] = ops_per_s(ops, seq_get(bare_get, read_keys), rounds)
    results["get ours (sync core)"] = ops_per_s(ops, seq_get(sync.get, read_keys), rounds)
    results["get ours (async)"] = ops_per_s(ops, async_get_loop, rounds)
    results["get peer RemoteKVConnector"] = ops_per_s(ops, seq_get(peer.get, read_keys), rounds)

    def batch_put_ours() -> None:
        tag = secrets.token_hex(4)
        anyio.run(async_client.put_many, [(f"bo:{tag}:{i}", values[i % 8]) for i in range(BATCH)])

    def batch_put_peer() -> None:
        tag = secrets.token_hex(4)
        for i in range(BATCH):
            peer.put(f"bq:{tag}:{i}", values[i % 8])

    batch_keys = read_keys[:BATCH]

    def batch_get_ours() -> None:
        anyio.run(async_client.get_many, batch_keys)

    def batch_get_peer() -> None:
        for key in batch_keys:
            peer.get(key)

    many_rounds = max(rounds, 5)
    results["put_many(64) ours"] = ops_per_s(BATCH, batch_put_ours, many_rounds)
    results["put x64 peer loop"] = ops_per_s(BATCH, batch_put_peer, many_rounds)
    results["get_many(64) ours"] = ops_per_s(BATCH, batch_get_ours, many_rounds)
    results["get x64 peer loop"] = ops_per_s(BATCH, batch_get_peer, many_rounds)
    sync.close()
    peer.close()
    return results


def print_table(r: dict[str, float], ops: int, rounds: int) -> None:
    print(f"KV data path, 256 KiB blocks, memory backend; best of {rounds} rounds, {ops} ops each")
    print(f"{'path':<30}{'ops/s':>10}{'MB/s':>10}")
    for name, value in r.items():
        print(f"{name:<30}{value:>10.0f}{value * BLOCK / 1e6:>10.0f}")
    print()
    print(f"{'ratio':<52}{'value':>8}{'goal':>8}")
    checks = [
        ("put: ours async / bare http.client", "put ours (async)", "put bare http.client", 0.9),
        ("get: ours async / bare http.client", "get ours (async)", "get bare http.client", 0.9),
        ("put: ours sync / bare http.client", "put ours (sync core)", "put bare http.client", 0.9),
        ("get: ours sync / bare http.client", "get ours (sync core)", "get bare http.client", 0.9),
        ("put: ours async / peer", "put ours (async)", "put peer RemoteKVConnector", 1.5),
        ("get: ours async / peer", "get ours (async)", "get peer RemoteKVConnector", 1.5),
        ("put_many(64) / peer loop", "put_many(64) ours", "put x64 peer loop", 2.0),
        ("get_many(64) / peer loop", "get_many(64) ours", "get x64 peer loop", 2.0),
    ]
    for label, mine, base, goal in checks:
        ratio = r[mine] / r[base]
        print(f"{label:<52}{ratio:>7.2f}x{goal:>7.1f}x {'ok' if ratio >= goal else 'BELOW GOAL'}")


if __name__ == "__main__":
    main()
