"""Two snapshots of the same server and model → what moved between them. Pure."""

from __future__ import annotations

from graph_kvcache_mcp.domain.vllm.metrics.models import MetricsDelta, MetricsSnapshot, TtftSummary
from graph_kvcache_mcp.domain.vllm.metrics.names import ENGINE_KV_FIELDS
from graph_kvcache_mcp.domain.vllm.metrics.numbers import difference, ratio, ttft_summary


def delta(before: MetricsSnapshot, after: MetricsSnapshot) -> MetricsDelta:
    """What moved from `before` to `after`; counters that went backwards mean a restart."""
    fields = (
        "prefix_cache_queries_tokens",
        "prefix_cache_hits_tokens",
        "external_prefix_cache_queries_tokens",
        "external_prefix_cache_hits_tokens",
        "prompt_tokens",
        "prompt_tokens_cached",
        "generation_tokens",
        *ENGINE_KV_FIELDS.values(),
    )
    moved: dict[str, int | None] = {}
    reset = False
    for name in fields:
        diff = difference(getattr(before, name), getattr(after, name))
        if diff is not None and diff < 0:
            reset, diff = True, None
        moved[name] = diff
    ttft, first_tokens = _ttft_window(before, after)
    if first_tokens is not None and first_tokens < 0:
        reset, ttft, first_tokens = True, None, None
    window = None
    if before.scraped_at is not None and after.scraped_at is not None:
        window = max(0.0, after.scraped_at - before.scraped_at)
    return MetricsDelta(
        model_name=after.model_name,
        window_s=window,
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
