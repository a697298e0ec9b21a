"""Benchmark the design's stack on CPU: time to first token after restarts, by the tier that serves.

On `bench_connector.py`'s model (a random Llama whose prefill dominates: 8 layers, hidden 1024,
16 KV heads of 64) and prompts (P distinct random prompts of T tokens, one output token, so
latency is TTFT), in one run:

- **LMCache L1**: vLLM -> `lmcache server` (L2: our native adapter on a managed engine). Run 1
  sends the prompts cold; vLLM is restarted and sends them again (served from the server's L1),
  then P fresh prompts (cold, the baseline in the same process).
- **engine via LMCache L2**: the server is restarted too (empty L1) and vLLM again: the same
  prompts come from the engine through the adapter, then P more fresh prompts (a second cold
  baseline in that process, so load that changes between phases shows).
- **EngineKVConnector**: a vLLM whose KV tier is the engine directly, cold, restarted, warm.
- **no connector**: a plain vLLM sends the fresh prompts (what a connector's saves cost).

Printed: medians per phase, each warm path's ratio over cold (goal >= 3x), cached tokens and
tokens loaded per second of warm TTFT; for L2, how long the server's prefetches from the engine
took (its log), since LMCache loads a prompt's L2 chunks whole before it answers vLLM.

Usage: `.venv/bin/python tools/bench_stack.py [--prompts 3] [--tokens 3072]`. Needs `.venv-vllm`
with lmcache (./run.sh test installs it), `.venv-lmcache` and the `engine` extra. Starts six
vLLMs: ten minutes or more on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support has the model builder and the stack helpers

from graph_kvcache_mcp.connectors.files.hf_config import read_hf_config  # noqa: E402
from graph_kvcache_mcp.domain.lmcache.model import facts_from_hf_config  # noqa: E402
from graph_kvcache_mcp.domain.outcomes import Presence  # noqa: E402
from tests.support.engines import RunningEngine, running_engine  # noqa: E402
from tests.support.l2_paths import mp_vllm, native_server  # noqa: E402
from tests.support.vllm import add_bench_model_arguments, bench_model_dir  # noqa: E402
from tests.support.vllm_connector import connector_vllm, random_prompt, ttfts  # noqa: E402

RATIO_GOAL = 3.0
L2_PHASE = "engine via LMCache L2 (server + vLLM restarted)"
L2_COLD = "cold (fresh prompts, the L2 phase's vLLM)"
PREFETCH_LINE = re.compile(r"\(\d+ L1, (\d+) L2\) in ([0-9.]+) ms")
L2_STORED = "lmcache_mp_l2_store_completed_objects_chunks_total"
CHUNK_TOKENS = 256
BLOCK_TOKENS = 32
DRAIN_LINE = re.compile(r"EngineKVConnector: ((?:stopping|the saves were|gave up)[^\n]*)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bench_model_arguments(parser)
    parser.add_argument(
        "--connector-only",
        action="store_true",
        help="only EngineKVConnector's cold, stop, restart and warm runs (no LMCache)",
    )
    args = parser.parse_args()
    model = bench_model_dir(args.layers, args.hidden, args.kv_heads)
    if args.connector_only:
        return connector_only(args, model)
    facts = facts_from_hf_config(read_hf_config(model), name="bench-llama")
    saved = [random_prompt(args.tokens, seed=1000 + i) for i in range(args.prompts)]
    fresh = [random_prompt(args.tokens, seed=2000 + i) for i in range(args.prompts)]
    later = [random_prompt(args.tokens, seed=2500 + i) for i in range(args.prompts)]
    warmup = [random_prompt(64, seed=3000 + i) for i in range(6)]
    chunks = args.prompts * (args.tokens // CHUNK_TOKENS)
    overrides: dict[str, Any] = {
        "max_model_len": args.tokens + 64,
        "kv_cache_memory_bytes": 2 * 1024**3,
    }
    phases: dict[str, tuple[list[float], list[int]]] = {}
    loads: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-stack-") as tmp,
        running_engine(Path(tmp) / "engine", "memory") as engine,
    ):
        root = Path(tmp)
        with native_server(root / "lmc", engine, facts, chunk_tokens=CHUNK_TOKENS) as server:
            with mp_vllm(
                root / "v", server, kv_connector="mp_native", model_dir=model, **overrides
            ) as s:
                s.complete(warmup[0], max_tokens=1)
                phases["stack cold (run 1)"] = ttfts(s, saved)
            server.wait_counter(L2_STORED, at_least=chunks, timeout_s=600)
            with mp_vllm(
                root / "v", server, kv_connector="mp_native", model_dir=model, **overrides
            ) as s:
                s.complete(warmup[1], max_tokens=1)
                phases["LMCache L1 (vLLM restarted)"] = ttfts(s, saved)
                phases["cold (fresh prompts)"] = ttfts(s, fresh)
        # a new server (empty L1) and a new vLLM: every hit comes from the engine
        with (
            native_server(root / "lmc", engine, facts, chunk_tokens=CHUNK_TOKENS) as server,
            mp_vllm(
                root / "v", server, kv_connector="mp_native", model_dir=model, **overrides
            ) as s,
        ):
            s.complete(warmup[2], max_tokens=1)
            phases[L2_PHASE] = ttfts(s, saved)
            phases[L2_COLD] = ttfts(s, later)
            loads = l2_loads(Path(server.status.log_path or ""))
        phase, restored = connector_restart(root, engine, model, overrides, saved, warmup)
        phases["EngineKVConnector (vLLM restarted)"] = phase
        plain = {**overrides, "kv_connector": "none"}
        with connector_vllm(root / "p", engine, model_dir=model, **plain) as c:
            c.complete(warmup[5], max_tokens=1)
            phases["no connector (fresh prompts)"] = ttfts(c, fresh)
    token_bytes = facts.kv_bytes_per_token(1)
    print(restored)
    return report(args, phases, loads, token_bytes)


def connector_restart(
    root: Path,
    engine: RunningEngine,
    model: Path,
    overrides: dict[str, Any],
    saved: list[list[int]],
    warmup: list[list[int]],
) -> tuple[tuple[list[float], list[int]], str]:
    """EngineKVConnector cold, stopped right after its last answer (as a user would: the stop
    waits for the saves), restarted and warm: the warm phase and what came back."""
    direct = {**overrides, "kv_connector": "engine"}
    with connector_vllm(root / "c", engine, model_dir=model, **direct) as c:
        c.complete(warmup[3], max_tokens=1)
        ttfts(c, saved)  # cold: the connector saves every block
        keys = [c.keys_of(prompt) for prompt in saved]
        log = c.managed.log_path
    stop_lines = DRAIN_LINE.findall(log.read_text(errors="replace"))
    with engine.sync_client() as client:
        in_engine = [sum(p == Presence(True) for p in client.contains_many(k)) for k in keys]
    with connector_vllm(root / "c", engine, model_dir=model, **direct) as c:
        c.complete(warmup[4], max_tokens=1)
        phase = ttfts(c, saved)
    full = [(len(prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS for prompt in saved]
    return phase, restore_report(full, phase[1], in_engine, stop_lines)


def restore_report(
    full: list[int], cached: list[int], in_engine: list[int], stop_lines: list[str]
) -> str:
    """ "all N full blocks restored", or which prompts fell short and what the stop logged."""
    if cached == full:
        return f"EngineKVConnector restart: all {sum(full) // BLOCK_TOKENS} full blocks restored"
    short = [
        f"prompt {i}: {got} of {want} tokens cached, {blocks} of its full blocks in the engine "
        "right after the stop"
        for i, (want, got, blocks) in enumerate(zip(full, cached, in_engine, strict=True))
        if got != want
    ]
    said = "; ".join(stop_lines) or "the stop logged nothing about saves (vLLM was killed?)"
    return (
        "EngineKVConnector restart: NOT all full blocks restored: "
        + "; ".join(short)
        + (f". The stop said: {said}")
    )


def connector_only(args: argparse.Namespace, model: Path) -> int:
    saved = [random_prompt(args.tokens, seed=1000 + i) for i in range(args.prompts)]
    warmup = [random_prompt(64, seed=3000 + i) for i in range(6)]
    overrides: dict[str, Any] = {"max_model_len": args.tokens + 64, "kv_cache_memory_bytes": 2**31}
    with (
        tempfile.TemporaryDirectory(prefix="bench-stack-") as tmp,
        running_engine(Path(tmp) / "engine", "memory") as engine,
    ):
        (times, cached), restored = connector_restart(
            Path(tmp), engine, model, overrides, saved, warmup
        )
    print(f"prompts: {args.prompts} x {args.tokens} tokens; load average {os.getloadavg()[0]:.1f}")
    print(f"EngineKVConnector (vLLM restarted): TTFT median {statistics.median(times):.3f} s")
    print(f"cached tokens: {cached}")
    print(restored)
    return 0 if restored.startswith("EngineKVConnector restart: all") else 1


def l2_loads(log: Path) -> list[float]:
    """Seconds each of the server's prefetches that loaded chunks from L2 took, from its log
    ("Prefetch request completed (L1+L2): ... (0 L1, 12 L2) in 1451.7 ms")."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [float(ms) / 1000 for l2, ms in PREFETCH_LINE.findall(text) if int(l2) > 0]


def report(
    args: argparse.Namespace,
    phases: dict[str, tuple[list[float], list[int]]],
    loads: list[float],
    token_bytes: int,
) -> int:
    print(f"model: {args.layers} layers, hidden {args.hidden}, {args.kv_heads} KV heads of 64")
    print(f"prompts: {args.prompts} x {args.tokens} tokens; LMCache chunk {CHUNK_TOKENS}")
    cold = statistics.median(phases["cold (fresh prompts)"][0])
    bare = statistics.median(phases["no connector (fresh prompts)"][0])
    print(
        f"{'phase':50} {'TTFT median':>12} {'cached':>8} {'vs cold':>8} {'vs none':>8} "
        f"{'tokens/s':>10}"
    )
    ok = True
    for name, (times, cached) in phases.items():
        ttft = statistics.median(times)
        hit = int(statistics.median(cached))
        warm = hit > 0
        rate = f"{hit / ttft:>10,.0f}" if warm else f"{'':>10}"
        print(
            f"{name:50} {ttft:>10.3f} s {hit:>8} {cold / ttft:>7.2f}x {bare / ttft:>7.2f}x {rate}"
        )
        if warm and "run 1" not in name:
            ok = ok and cold / ttft >= RATIO_GOAL
    l2_ttft = statistics.median(phases[L2_PHASE][0])
    own_cold = statistics.median(phases[L2_COLD][0])
    print(f"L2 vs cold in its own vLLM (same process, right after): {own_cold / l2_ttft:.2f}x")
    if loads:
        load_s = statistics.median(loads)
        chunk_mib = CHUNK_TOKENS * token_bytes / 2**20
        chunks = args.tokens // CHUNK_TOKENS
        print(
            f"LMCache's L2 prefetches (server log): median {load_s:.3f} s for {chunks} chunks of "
            f"{chunk_mib:.0f} MiB ({chunks * chunk_mib / load_s:,.0f} MiB/s), {len(loads)} of them"
        )
        print(
            "  the server loads every L2 chunk of a prompt into L1 before it answers vLLM's "
            "lookup, so L2 TTFT = L1 TTFT + that load"
        )
    print(f"goal: every warm path >= {RATIO_GOAL}x over cold: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
