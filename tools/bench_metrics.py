"""Benchmark the /metrics snapshot: our filtered parse vs a naive full parse of the same text.

The exposition is a real capture from vLLM serving the tiny test model
(`tests/data/vllm_metrics_single.prom`), widened to many models and engines until it has about
10,000 lines, as a scrape of a busy multi-model deployment would. Both sides build the snapshot for
one model in the same run; the naive side runs prometheus-client's `text_string_to_metric_families`
over every line first. The numbers must be identical, or the benchmark fails.

Usage: `.venv/bin/python tools/bench_metrics.py [--lines N] [--rounds R]`.
Each figure is the median of R rounds (ms), to damp noise on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from graph_kvcache_mcp.domain.vllm.metrics import (
    MetricsSnapshot,
    parse_snapshot,
    relevant_lines,
    snapshot_from_families,
)

CAPTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm_metrics_single.prom"
CAPTURED_MODEL = 'model_name="tiny-llama"'
ENGINES_PER_MODEL = 2
GOAL = 8.0


def widen(text: str, target_lines: int) -> tuple[str, list[str]]:
    """Copy every model series to more models (each on two engines) until ~target_lines."""
    lines = text.split("\n")
    per_copy = sum(1 for line in lines if CAPTURED_MODEL in line and not line.startswith("#"))
    fixed = len(lines) - per_copy
    copies = max(1, round((target_lines - fixed) / per_copy))
    models = [f"org/model-{i:02d}" for i in range(max(1, copies // ENGINES_PER_MODEL))]
    series = [(m, str(e)) for m in models for e in range(ENGINES_PER_MODEL)]
    out: list[str] = []
    for line in lines:
        if line.startswith("vllm:cache_config_info{"):
            engines = sorted({e for _m, e in series})
            out += [line.replace('engine="0"', f'engine="{e}"') for e in engines]
        elif CAPTURED_MODEL in line and not line.startswith("#"):
            for index, (model, engine) in enumerate(series):
                head, value = line.rsplit(" ", 1)
                head = head.replace(CAPTURED_MODEL, f'model_name="{model}"')
                head = head.replace('engine="0"', f'engine="{engine}"')
                out.append(f"{head} {float(value) * (index + 1)!r}")
        else:
            out.append(line)
    return "\n".join(out), models


def naive(text: str, model: str | None) -> MetricsSnapshot:
    return snapshot_from_families(text_string_to_metric_families(text), model)


def median_ms(run: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    text, models = widen(CAPTURE.read_text(), args.lines)
    model = models[len(models) // 2]
    total_lines = text.count("\n") + 1
    kept_lines = relevant_lines(text, model).count("\n")

    ours_snapshot, naive_snapshot = parse_snapshot(text, model), naive(text, model)
    if ours_snapshot != naive_snapshot:
        print("MISMATCH: the filtered parse differs from the full parse", file=sys.stderr)
        return 1
    all_ours, all_naive = parse_snapshot(text, None), naive(text, None)
    if all_ours != all_naive:
        print("MISMATCH (all models): the filtered parse differs", file=sys.stderr)
        return 1

    naive_ms = median_ms(lambda: naive(text, model), args.rounds)
    ours_ms = median_ms(lambda: parse_snapshot(text, model), args.rounds)
    filter_ms = median_ms(lambda: relevant_lines(text, model), args.rounds)
    naive_all_ms = median_ms(lambda: naive(text, None), args.rounds)
    ours_all_ms = median_ms(lambda: parse_snapshot(text, None), args.rounds)

    print(
        f"exposition: {total_lines:,} lines, {len(text):,} bytes, {len(models)} models x "
        f"{ENGINES_PER_MODEL} engines (from a real vLLM capture); snapshot for {model!r} "
        f"({kept_lines} lines kept by the filter)"
    )
    print(f"median of {args.rounds} rounds; numbers identical on both sides: yes\n")
    rows = [
        ("one model", naive_ms, ours_ms),
        ("all models summed", naive_all_ms, ours_all_ms),
    ]
    print(f"{'case':<20} {'naive full parse':>17} {'ours':>10} {'speed-up':>9}")
    for name, slow, fast in rows:
        print(f"{name:<20} {slow:>14.1f} ms {fast:>7.2f} ms {slow / fast:>8.1f}x")
    print(f"{'  (of which filter)':<20} {'':>17} {filter_ms:>7.2f} ms")
    print(
        f"\nsnapshot: hits {ours_snapshot.prefix_cache_hits_tokens} / queries "
        f"{ours_snapshot.prefix_cache_queries_tokens} tokens, engines {ours_snapshot.engines}"
    )
    ratio = naive_ms / ours_ms
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"goal >= {GOAL:.0f}x for one model: {verdict} ({ratio:.1f}x)")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
