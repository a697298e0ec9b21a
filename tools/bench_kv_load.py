"""Benchmark EngineKVConnector's load path against the fastest reference reader, side by side.

No vLLM: a managed engine (memory backend) holds B blocks encoded exactly as the connector stores
them (default: the `bench_connector.py` model, 8 layers of 128 KiB pages, 1 MiB per block), and a
paged KV cache of torch tensors in vLLM's CPU layout receives them. Timed back to back, each R
times (medians):

- `reference`: raw sockets on N lanes, one GET per block received into a reused buffer, no HTTP
  parsing, no checks: the ceiling of this engine on this machine (best lane count of 1-16);
- `connector`: the connector's own load (`BlockLoader`: values received on the client's lanes
  straight into the blocks' pages of the cache, checked as they arrive);
- `connector, through a slot`: the same reads into one-block slots, checked, then copied into
  the cache by the lane that received them (the path for caches that are not host memory);
- `connector, no checks`: the same reads without the payload checksum (what checking costs);
- `before`: the path this replaced (whole values as bytes, `decode_block`, joined, scattered).

Reported: GB/s per path, each as a ratio to the reference, the connector's rate as a share of
the plain 8-thread GET loop (the `load share [...]` line; CI's smoke run prints it:
`tests/integration/connectors/test_bench_kv_load_smoke.py`), and bytes copied per byte loaded.
Usage: `.venv-vllm/bin/python tools/bench_kv_load.py [--blocks 96] [--repeats 5] [--profile]`.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Runs under vLLM's venv (torch); the engine binary comes from the main venv's wheel (last).
sys.path += [str(path) for path in (REPO / ".venv" / "lib").glob("python3*/site-packages")]
os.environ["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient  # noqa: E402
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine  # noqa: E402
from graph_kvcache_mcp.domain.vllm.kv_blocks import (  # noqa: E402
    KvModelIdentity,
    PayloadCheck,
    block_keys,
    decode_block,
    encode_block,
)
from graph_kvcache_mcp.plugins.vllm_kv.pages import PagedKvCache  # noqa: E402
from graph_kvcache_mcp.plugins.vllm_kv.receive import BlockLoader  # noqa: E402
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore  # noqa: E402
from tests.support.kv_identity import kv_identity  # noqa: E402
from tests.support.wire_reference import LOOP_LANES, load_share_line, reference_read  # noqa: E402


def connector_read(loader: BlockLoader, keys: list[str]) -> float:
    """Seconds for the connector's load of `keys` into blocks 0..n-1 (all must load)."""
    began = time.perf_counter()
    result = loader.load(keys, list(range(len(keys))))
    took = time.perf_counter() - began
    assert result.loaded_blocks == len(keys), result.failure
    return took


def before_read(
    store: EngineBlockStore, ident: KvModelIdentity, pages: PagedKvCache, keys: list[str]
) -> float:
    """The load path as it was: whole values as bytes, decoded, joined, then scattered."""
    began = time.perf_counter()
    good = []
    for key, value in zip(keys, store.fetch(keys), strict=True):
        assert value is not None
        decoded = decode_block(value, key, ident)
        assert isinstance(decoded, memoryview)
        good.append(decoded)
    joined = bytearray().join(good)
    buffer = torch.frombuffer(joined, dtype=torch.uint8).view(pages.dtype)
    blocks = buffer.reshape(len(keys), len(pages.layers), *pages.page_shape)
    index = torch.tensor(list(range(len(keys))), dtype=torch.long)
    for position, layer in enumerate(pages.layers):
        layer.index_copy_(0, index, blocks[:, position])
    return time.perf_counter() - began


@contextmanager
def _unchecked() -> Iterator[None]:
    """Every payload checksum skipped and taken as matching (measures what checking costs)."""
    real = PayloadCheck.update, PayloadCheck.matches
    PayloadCheck.update = lambda self, chunk: None  # type: ignore[method-assign]
    PayloadCheck.matches = lambda self: True  # type: ignore[method-assign]
    try:
        yield
    finally:
        PayloadCheck.update, PayloadCheck.matches = real  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=16)
    parser.add_argument("--lanes", type=int, default=8, help="the connector's lanes")
    parser.add_argument("--profile", action="store_true", help="cProfile one connector load")
    args = parser.parse_args()
    ident = kv_identity(layers=args.layers, kv_heads=args.kv_heads, block_size=32)
    caches = {
        f"layer.{n}": torch.zeros((args.blocks, args.kv_heads, 32, 128), dtype=torch.bfloat16)
        for n in range(args.layers)
    }
    pages = PagedKvCache(caches)
    keys = block_keys(ident.digest, list(range(args.blocks * 32)), 32)
    payload = torch.randint(0, 255, (ident.block_bytes,), dtype=torch.uint8).numpy().tobytes()
    values = [encode_block(key, ident, payload) for key in keys]
    with tempfile.TemporaryDirectory(prefix="bench-kv-load-") as tmp:
        managed = ManagedEngine(Path(tmp) / "engine")
        managed.start(backend="memory")
        state = managed.running_state()
        assert state is not None
        token = managed.token()
        host, port = state.base_url.removeprefix("http://").rsplit(":", 1)
        client = SyncKvClient(state.base_url, token, timeout_s=30.0, concurrency=args.lanes)
        store = EngineBlockStore(client, timeout_s=30.0, concurrency=args.lanes)
        try:
            client.put_many(list(zip(keys, values, strict=True)))
            loader = BlockLoader(store, ident, pages.write_block, pages.block_pages)
            slotted = BlockLoader(store, ident, pages.write_block)
            secret = token.get_secret_value() if token is not None else ""

            def ref(lanes: int) -> Callable[[], float]:
                return lambda: reference_read(host, int(port), secret, keys, lanes)

            runs: dict[str, Callable[[], float]] = {
                **{f"reference, {n} lanes": ref(n) for n in (1, 2, 4, 8, 16)},
                "connector": lambda: connector_read(loader, keys),
                "connector, through a slot": lambda: connector_read(slotted, keys),
                "before": lambda: before_read(store, ident, pages, keys),
            }
            times: dict[str, list[float]] = {name: [] for name in [*runs, "connector, no checks"]}
            for _ in range(args.repeats):  # interleaved, so load drift hits every path alike
                for name, run in runs.items():
                    times[name].append(run())
                with _unchecked():
                    times["connector, no checks"].append(runs["connector"]())
            if args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                runs["connector"]()
                profiler.disable()
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(18)
        finally:
            store.close(flush_timeout_s=1.0)
            managed.stop(term_wait_s=5.0)
    moved = args.blocks * ident.block_bytes
    medians = {name: statistics.median(taken) for name, taken in times.items()}
    reference = min(value for name, value in medians.items() if name.startswith("reference"))
    print(f"{args.blocks} blocks of {ident.block_bytes:,} bytes; {args.repeats} repeats; medians")
    print("| path | median s | GB/s | vs reference |")
    print("|---|---|---|---|")
    for name, median in medians.items():
        rate = moved / median / 1e9
        print(f"| {name} | {median:.4f} | {rate:.2f} | {reference / median:.2f} |")
    loop = moved / medians[f"reference, {LOOP_LANES} lanes"]
    print(load_share_line("dense, no vLLM", moved / medians["connector"], loop))
    print("bytes copied per byte loaded: connector 1 (socket to cache); through a slot 2 ")
    print("(socket to slot, slot to cache); before 4 (socket to chunks, chunks joined into bytes, ")
    print("joined again, scattered)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
