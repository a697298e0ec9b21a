"""The arithmetic snapshots and windows share: rounding, sums, ratios, TTFT quantiles. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from graph_kvcache_mcp.domain.vllm.metrics.models import TtftSummary


def ttft_summary(
    buckets: list[tuple[float, int]] | None, total_s: float | None, count: float | None
) -> TtftSummary | None:
    if count is None or total_s is None:
        return None
    n = round(count)
    return TtftSummary(
        count=n,
        sum_s=total_s,
        mean_s=total_s / n if n else None,
        p50_s=histogram_quantile(buckets, n, 0.50),
        p95_s=histogram_quantile(buckets, n, 0.95),
    )


def histogram_quantile(
    buckets: list[tuple[float, int]] | None, count: int, q: float
) -> float | None:
    """Prometheus-style quantile: linear within the bucket that holds rank q*count.

    `buckets` are the finite (le, cumulative count) pairs; a rank past the last one can only be
    placed at that bound (the +Inf bucket has no upper edge).
    """
    if not buckets or count <= 0:
        return None
    rank = q * count
    lower_bound, lower_count = 0.0, 0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            span = cumulative - lower_count
            if span <= 0:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / span
        lower_bound, lower_count = bound, cumulative
    return lower_bound


def int_or_none(value: float | None) -> int | None:
    return None if value is None else round(value)


def int_map(values: Mapping[str, float] | None) -> dict[str, int] | None:
    return None if values is None else {k: round(v) for k, v in sorted(values.items())}


def sum_or_none(values: list[float] | None) -> float | None:
    return None if values is None else sum(values)


def difference(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def ratio(part: int | None, whole: int | None) -> float | None:
    if part is None or not whole:
        return None
    return part / whole
