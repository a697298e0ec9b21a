"""Benchmark the KV data path: our client vs a bare http.client loop vs the peer client.

One managed engine (memory backend), 256 KiB blocks, all measured in one run and printed side by
side with ratios. Usage: `.venv/bin/python tools/bench_kv.py [--ops N] [--rounds R]`. Needs the
`engine` and `bench` extras (epistemic-graph-server, epistemic-graph 2.27.7).

Rows:
  sequential  one operation at a time: bare http.client, our sync core, our async client, the peer,
              and httpx (and httpx2, when installed) with a pooled Client / AsyncClient: the
              general HTTP clients we would use instead of writing the HTTP/1.1 exchange ourselves
  batch       64 blocks: our put_many/get_many (bounded concurrency) vs the peer's one-by-one loop
Each figure is the best of R rounds (ops/s), to damp noise on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import http.client
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
from epistemic_graph.kvcache import KvCacheConfig, RemoteKVConnector
from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine

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


HTTP_LIBRARIES: dict[str, Any] = {"httpx": httpx}
try:  # the fork the package uses for vLLM and LMCache's admin API
    import httpx2

    HTTP_LIBRARIES["httpx2"] = httpx2
except ImportError:  # pragma: no cover - the bench runs without it
    pass


def library_client(library: Any, base_url: str, token: str) -> tuple[Callable[..., None], ...]:
    """put, get and close over one pooled (keep-alive) `Client` of an httpx-like library."""
    client = library.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )

    def put(key: str, value: bytes) -> None:
        client.put(f"/kv/{key}", content=value).read()

    def get(key: str) -> None:
        client.get(f"/kv/{key}").read()

    return put, get, client.close


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
    values = [secrets.token_bytes(BLOCK) for _ in range(8)]
    sync = SyncKvClient(base_url, SecretStr(token), timeout_s=10, concurrency=8)
    peer = RemoteKVConnector(KvCacheConfig(base_url=base_url, token=token, timeout_s=10))
    bare_put, bare_get = bare_http_client("127.0.0.1", port, token)
    read_keys = [f"read:{i}" for i in range(ops)]
    sync.put_many([(k, values[i % 8]) for i, k in enumerate(read_keys)])
    batch_keys = read_keys[:BATCH]
    results: dict[str, float] = {}

    def fresh_puts(put: Callable[[str, bytes], object], count: int) -> Callable[[], None]:
        def run() -> None:
            tag = secrets.token_hex(4)
            for i in range(count):
                put(f"p:{tag}:{i}", values[i % 8])

        return run

    def gets(get: Callable[[str], object], keys: list[str]) -> Callable[[], None]:
        def run() -> None:
            for key in keys:
                get(key)

        return run

    results["put bare http.client"] = ops_per_s(ops, fresh_puts(bare_put, ops), rounds)
    results["put ours (sync core)"] = ops_per_s(ops, fresh_puts(sync.put, ops), rounds)
    results["put peer RemoteKVConnector"] = ops_per_s(ops, fresh_puts(peer.put, ops), rounds)
    results["get bare http.client"] = ops_per_s(ops, gets(bare_get, read_keys), rounds)
    results["get ours (sync core)"] = ops_per_s(ops, gets(sync.get, read_keys), rounds)
    results["get peer RemoteKVConnector"] = ops_per_s(ops, gets(peer.get, read_keys), rounds)
    for name, library in HTTP_LIBRARIES.items():
        put, get, close = library_client(library, base_url, token)
        results[f"put {name} (sync)"] = ops_per_s(ops, fresh_puts(put, ops), rounds)
        results[f"get {name} (sync)"] = ops_per_s(ops, gets(get, read_keys), rounds)
        close()
    # The async rows run inside one event loop, as in a server: anyio.run per round would add
    # asyncio's repr of the finished task's result (64 x 256 KiB) to every batch.
    results.update(
        anyio.run(async_rows, sync, values, read_keys, batch_keys, rounds, base_url, token)
    )
    many_rounds = max(rounds, 5)
    results["put x64 peer loop"] = ops_per_s(BATCH, fresh_puts(peer.put, BATCH), many_rounds)
    results["get x64 peer loop"] = ops_per_s(BATCH, gets(peer.get, batch_keys), many_rounds)
    sync.close()
    peer.close()
    return results


async def async_rows(
    sync: SyncKvClient,
    values: list[bytes],
    read_keys: list[str],
    batch_keys: list[str],
    rounds: int,
    base_url: str,
    token: str,
) -> dict[str, float]:
    client = KvClient(sync)

    async def best(count: int, run: Callable[[], Awaitable[object]], times: int) -> float:
        top = 0.0
        for _ in range(times):
            started = time.perf_counter()
            await run()
            top = max(top, count / (time.perf_counter() - started))
        return top

    async def puts() -> None:
        tag = secrets.token_hex(4)
        for i in range(len(read_keys)):
            await client.put(f"ap:{tag}:{i}", values[i % 8])

    async def gets() -> None:
        for key in read_keys:
            await client.get(key)

    async def put_batch() -> None:
        tag = secrets.token_hex(4)
        await client.put_many([(f"bo:{tag}:{i}", values[i % 8]) for i in range(BATCH)])

    async def get_batch() -> None:
        await client.get_many(batch_keys)

    many_rounds = max(rounds, 5)
    rows = {
        "put ours (async)": await best(len(read_keys), puts, rounds),
        "get ours (async)": await best(len(read_keys), gets, rounds),
        "put_many(64) ours": await best(BATCH, put_batch, many_rounds),
        "get_many(64) ours": await best(BATCH, get_batch, many_rounds),
    }
    for name, library in HTTP_LIBRARIES.items():
        headers = {"Authorization": f"Bearer {token}"}
        async with library.AsyncClient(base_url=base_url, headers=headers, timeout=10) as http:

            async def library_puts() -> None:
                tag = secrets.token_hex(4)
                for i in range(len(read_keys)):
                    await http.put(f"/kv/hp:{tag}:{i}", content=values[i % 8])

            async def library_gets() -> None:
                for key in read_keys:
                    await http.get(f"/kv/{key}")

            rows[f"put {name} (async)"] = await best(len(read_keys), library_puts, rounds)
            rows[f"get {name} (async)"] = await best(len(read_keys), library_gets, rounds)
    return rows


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
    for name in HTTP_LIBRARIES:
        for verb in ("put", "get"):
            for face in ("async", "sync"):
                ours = f"{verb} ours ({'async' if face == 'async' else 'sync core'})"
                label = f"{verb}: ours {face} / {name} {face}"
                checks.append((label, ours, f"{verb} {name} ({face})", 1.0))
    for label, mine, base, goal in checks:
        ratio = r[mine] / r[base]
        print(f"{label:<52}{ratio:>7.2f}x{goal:>7.1f}x {'ok' if ratio >= goal else 'BELOW GOAL'}")


if __name__ == "__main__":
    main()
