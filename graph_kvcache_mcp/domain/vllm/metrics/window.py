"""Two snapshots of the same server and model → what moved between them, also across restarts
whose final counts were recorded. Pure.

Every vLLM process counts from 0. A window from `before` to `after` in which the processes
`ended` stopped (their last scrapes, oldest first, the first being `before`'s own process) saw
`(ended[0] - before) + ended[1] + ... + after`; that is `after - baseline` for the baseline
`before - sum(ended)`, so `carried_baseline` builds that baseline and `delta` stays one
subtraction. A process change without its final counts (an unmanaged restart) leaves the
earlier process's tail unknown: the delta says `counter_reset` and reports no counter.
"""

from __future__ import annotations

from collections.abc import Sequence

from graph_kvcache_mcp.domain.vllm.metrics.models import MetricsDelta, MetricsSnapshot, TtftSummary
from graph_kvcache_mcp.domain.vllm.metrics.names import ENGINE_KV_FIELDS
from graph_kvcache_mcp.domain.vllm.metrics.numbers import difference, ratio, ttft_summary

COUNTER_FIELDS = (
    "prefix_cache_queries_tokens",
    "prefix_cache_hits_tokens",
    "external_prefix_cache_queries_tokens",
    "external_prefix_cache_hits_tokens",
    "prompt_tokens",
    "prompt_tokens_cached",
    "generation_tokens",
    *ENGINE_KV_FIELDS.values(),
)
"""The snapshot's counters: what a window subtracts."""


def restarted(before: MetricsSnapshot, after: MetricsSnapshot) -> bool:
    """Whether `after` comes from another vLLM process than `before` (both name their start)."""
    return (
        before.process_start_time_s is not None
        and after.process_start_time_s is not None
        and before.process_start_time_s != after.process_start_time_s
    )


def ended_in_window(
    before: MetricsSnapshot, after: MetricsSnapshot, finals: Sequence[MetricsSnapshot]
) -> list[MetricsSnapshot] | None:
    """Of `finals` (the last scrapes of processes that were stopped), those of the processes
    that ended between `before` and `after`, oldest first; None when `before`'s own process is
    not among them (its counts after `before` are unknown)."""
    start, end = before.process_start_time_s, after.process_start_time_s
    if start is None or end is None:
        return None
    ended = sorted(
        (f for f in finals if f.process_start_time_s is not None),
        key=lambda f: f.process_start_time_s or 0.0,
    )
    ended = [f for f in ended if start <= (f.process_start_time_s or 0.0) < end]
    if not ended or ended[0].process_start_time_s != start:
        return None
    return ended


def carried_baseline(before: MetricsSnapshot, ended: Sequence[MetricsSnapshot]) -> MetricsSnapshot:
    """The baseline that makes `after - baseline` count the `ended` processes' traffic too (see
    the module docstring): `before` less each ended process's final counts, in `after`'s
    process. Its counters may be negative; only a window subtracts them."""
    counters: dict[str, object] = {}
    for name in COUNTER_FIELDS:
        values = [getattr(before, name), *(getattr(f, name) for f in ended)]
        counters[name] = None if None in values else values[0] - sum(values[1:])
    for name in ("prompt_tokens_by_source", "prompt_tokens_cached_by_source"):
        maps = [getattr(before, name), *(getattr(f, name) for f in ended)]
        if None in maps:
            counters[name] = None
            continue
        keys = {key for m in maps for key in m}
        counters[name] = {k: maps[0].get(k, 0) - sum(m.get(k, 0) for m in maps[1:]) for k in keys}
    counters["ttft"], counters["ttft_buckets"] = _carried_ttft(before, ended)
    return before.model_copy(update={**counters, "process_start_time_s": None})


def _carried_ttft(
    before: MetricsSnapshot, ended: Sequence[MetricsSnapshot]
) -> tuple[TtftSummary | None, list[tuple[float, int]] | None]:
    summaries = [before.ttft, *(f.ttft for f in ended)]
    if any(t is None for t in summaries):
        return None, None
    known = [t for t in summaries if t is not None]
    count = known[0].count - sum(t.count for t in known[1:])
    sum_s = known[0].sum_s - sum(t.sum_s for t in known[1:])
    ttft = TtftSummary(count=count, sum_s=sum_s, mean_s=None, p50_s=None, p95_s=None)
    bucket_lists = [before.ttft_buckets, *(f.ttft_buckets for f in ended)]
    if any(b is None for b in bucket_lists):
        return ttft, None
    tables = [dict(b or ()) for b in bucket_lists]
    bounds = sorted({le for table in tables for le in table})
    buckets = [(le, tables[0].get(le, 0) - sum(t.get(le, 0) for t in tables[1:])) for le in bounds]
    return ttft, buckets


def baseline_across(
    before: MetricsSnapshot, after: MetricsSnapshot, finals: Sequence[MetricsSnapshot] = ()
) -> tuple[MetricsSnapshot, int] | None:
    """The baseline to subtract from `after` for the window since `before`, and how many
    restarts it counts across; None when vLLM restarted without its final counts in `finals`."""
    if not restarted(before, after):
        return before, 0
    ended = ended_in_window(before, after, finals)
    if ended is None:
        return None
    return carried_baseline(before, ended), len(ended)


def window(
    before: MetricsSnapshot, after: MetricsSnapshot, finals: Sequence[MetricsSnapshot] = ()
) -> MetricsDelta:
    """What moved from `before` to `after`, counted across the restarts whose final counts are
    in `finals`; `counter_reset` (no counters) across one whose are not."""
    across = baseline_across(before, after, finals)
    if across is None:
        return delta(before, after)
    baseline, restarts = across
    return delta(baseline, after).model_copy(update={"restarts": restarts})


def delta(before: MetricsSnapshot, after: MetricsSnapshot) -> MetricsDelta:
    """What moved from `before` to `after`. Counters that went backwards, or another process
    (a restart whose final counts are not known), make `counter_reset` and no counter."""
    if restarted(before, after):
        return MetricsDelta(
            model_name=after.model_name,
            window_s=_window_s(before, after),
            kv_cache_usage_perc=after.kv_cache_usage_perc,
            requests_running=after.requests_running,
            requests_waiting=after.requests_waiting,
            counter_reset=True,
        )
    moved: dict[str, int | None] = {}
    reset = False
    for name in COUNTER_FIELDS:
        diff = difference(getattr(before, name), getattr(after, name))
        if diff is not None and diff < 0:
            reset, diff = True, None
        moved[name] = diff
    ttft, first_tokens = _ttft_window(before, after)
    if first_tokens is not None and first_tokens < 0:
        reset, ttft, first_tokens = True, None, None
    return MetricsDelta(
        model_name=after.model_name,
        window_s=_window_s(before, after),
        prefix_cache_hit_rate=ratio(
            moved["prefix_cache_hits_tokens"], moved["prefix_cache_queries_tokens"]
        ),
        requests_with_first_token=first_tokens,
        ttft=ttft,
        kv_cache_usage_perc=after.kv_cache_usage_perc,
        requests_running=after.requests_running,
        requests_waiting=after.requests_waiting,
        counter_reset=reset,
        **moved,
    )


def _ttft_window(
    before: MetricsSnapshot, after: MetricsSnapshot
) -> tuple[TtftSummary | None, int | None]:
    if before.ttft is None or after.ttft is None:
        return None, None
    count = after.ttft.count - before.ttft.count
    if count < 0:
        return None, count
    buckets = None
    if before.ttft_buckets is not None and after.ttft_buckets is not None:
        # Snapshots read back from JSON carry no buckets: then no quantiles, never wrong ones.
        earlier = dict(before.ttft_buckets)
        buckets = [(le, n - earlier.get(le, 0)) for le, n in after.ttft_buckets]
    return ttft_summary(buckets or None, after.ttft.sum_s - before.ttft.sum_s, float(count)), count


def _window_s(before: MetricsSnapshot, after: MetricsSnapshot) -> float | None:
    if before.scraped_at is None or after.scraped_at is None:
        return None
    return max(0.0, after.scraped_at - before.scraped_at)
