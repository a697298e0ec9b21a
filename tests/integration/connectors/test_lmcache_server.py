"""Real LMCache 0.5.6 driving our native_plugin client: `lmcache server` and `lmcache bench l2`."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.lmcache.metrics import parse_lmcache_counters
from tests.support.engines import RunningEngine
from tests.support.lmcache import (
    adapter_json,
    engine_stats,
    require_lmcache,
    run_lmcache,
    running_lmcache_server,
)

pytestmark = pytest.mark.lmcache

# 2 layers x K/V x 256 tokens x 2 heads x 64 x fp16 = 256 KiB per chunk; 512 tokens = 2 chunks.
SHAPE = "(2,64,16,2,64):float16:2"
REQUESTS = 2
CHUNKS = REQUESTS * 2


def wait_for_stats(
    engine: RunningEngine, condition: Callable[[EngineStats], bool], what: str
) -> EngineStats:
    """L2 stores complete after LMCache answers its client: poll the engine under a deadline."""
    deadline = time.monotonic() + 30
    while True:
        stats = engine_stats(engine)
        if condition(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"engine never showed {what}: {stats}")
        time.sleep(0.2)


def bench_server(rpc_url: str, http_url: str, engine: RunningEngine) -> str:
    result = run_lmcache(
        [
            "bench",
            "server",
            "--rpc-url",
            rpc_url,
            "--url",
            http_url,
            "--mode",
            "cpu",
            "--kvcache-shape-spec",
            SHAPE,
            "--num-tokens",
            "512",
            "--start",
            "0",
            "--end",
            str(REQUESTS),
            "--interval",
            "0",
        ],
        engine,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def checksums(output: str, phase: str) -> dict[int, str]:
    pattern = rf"\[seq (\d+)/{phase}\] CHECKSUM: ([0-9a-f]+)"
    return {int(seq): digest for seq, digest in re.findall(pattern, output)}


def test_lmcache_server_stores_into_the_engine_and_reloads_from_it_after_l1_is_cleared(
    durable_engine: RunningEngine, tmp_path: Path
) -> None:
    require_lmcache()
    before = engine_stats(durable_engine)
    with running_lmcache_server(durable_engine, tmp_path) as server:
        first = bench_server(server.rpc_url, server.http_url, durable_engine)
        assert first.count("CHECKSUM MATCH OK") == REQUESTS
        stored = wait_for_stats(
            durable_engine,
            lambda s: (s.put_new or 0) - (before.put_new or 0) >= CHUNKS,
            f"{CHUNKS} new blocks",
        )

        assert server.post("/cache/clear") == {"status": "ok", "cleared": {"tier": "l1"}}
        second = bench_server(server.rpc_url, server.http_url, durable_engine)
        reloaded = wait_for_stats(
            durable_engine,
            lambda s: (s.get_hits or 0) - (stored.get_hits or 0) >= CHUNKS,
            f"{CHUNKS} GET hits",
        )
        log = server.log()
        with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as reply:
            counters = parse_lmcache_counters(reply.read().decode())

    # LMCache's per-adapter load counter, by its real name: our adapter's loads, none by P2P.
    assert (counters.l2_loads or 0) >= 1 and counters.p2p_loads == 0, counters
    assert "(0 L1, 2 L2)" in log, "the second pass must be served from L2, i.e. the engine"
    assert (reloaded.put_new or 0) - (before.put_new or 0) == CHUNKS, "nothing stored twice"
    # The warm pass zeroes its KV buffers and reloads them; equal checksums = bytes round-tripped.
    assert checksums(second, "warm") == checksums(first, "cold")
    assert len(checksums(second, "warm")) == REQUESTS
    assert durable_engine.token.get_secret_value() not in log


def test_lmcache_bench_l2_round_trips_through_the_adapter_and_verifies_bytes(
    memory_engine: RunningEngine,
) -> None:
    require_lmcache()
    before = engine_stats(memory_engine)
    result = run_lmcache(
        [
            "bench",
            "l2",
            "--l2-adapter",
            adapter_json(memory_engine, num_workers=2),
            "--num-keys",
            "8",
            "--data-size-kb",
            "64",
            "--no-skip-verify",
        ],
        memory_engine,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    after = engine_stats(memory_engine)
    stores = re.search(r"Operation:\s+Store.*?Total success:\s+(\d+)", output, re.S)
    loads = re.search(r"Operation:\s+Load.*?Total success:\s+(\d+)", output, re.S)
    assert stores and loads, output[-4000:]
    stored, loaded = int(stores.group(1)), int(loads.group(1))
    assert loaded == stored >= 8
    assert f"[Verify] All {stored} keys data verified OK." in output, output[-4000:]
    grew = (after.unique_blocks or 0) - (before.unique_blocks or 0)
    assert grew >= 8
    assert (after.resident_bytes or 0) - (before.resident_bytes or 0) == grew * 64 * 1024
    assert memory_engine.token.get_secret_value() not in output
