"""Trace accounting and run summaries: unknown stays unknown, estimates say their basis."""

from __future__ import annotations

import json

import pytest

from graph_kvcache_mcp.domain.vllm.traces import (
    CachedTokensSource,
    Trace,
    cache_split,
    parse_trace_lines,
    summarize,
)


def trace(
    prompt: int,
    hit: int | None,
    *,
    latency: float = 0.1,
    ttft: float | None = None,
    source: CachedTokensSource | None = None,
) -> Trace:
    hit_tokens, miss_tokens = cache_split(prompt, hit)
    return Trace(
        model="m",
        prompt_tokens=prompt,
        completion_tokens=4,
        prefix_cache_hit_tokens=hit_tokens,
        prefix_cache_miss_tokens=miss_tokens,
        cached_tokens_source=source or ("usage" if hit is not None else "unavailable"),
        latency_s=latency,
        ttft_s=ttft,
        stream=ttft is not None,
    )


def test_cache_split_keeps_unknown_as_none_and_clamps_to_the_prompt() -> None:
    assert cache_split(100, None) == (None, None)
    assert cache_split(100, 64) == (64, 36)
    assert cache_split(100, 128) == (100, 0)


def test_summary_counts_only_calls_with_cache_info_in_the_rates() -> None:
    traces = [trace(1000, 0), trace(1000, 960), trace(1000, None)]
    summary = summarize(traces)
    assert summary.calls == 3
    assert summary.calls_with_cache_info == 2
    assert summary.calls_by_source == {"unavailable": 1, "usage": 2}
    assert summary.total_tokens_saved == 960
    assert summary.avg_prefix_cache_hit_rate == pytest.approx((0 + 0.96) / 2)
    assert summary.token_hit_rate == pytest.approx(960 / 2000)
    assert summary.prompt_tokens == 3000


def test_compute_saved_uses_cold_calls_ttft_when_streamed() -> None:
    traces = [
        trace(1000, 0, latency=0.30, ttft=0.20),
        trace(1000, 0, latency=0.20, ttft=0.05),
        trace(1000, 900, latency=0.05, ttft=0.02),
    ]
    summary = summarize(traces)
    estimate = summary.compute_saved
    assert estimate is not None
    assert estimate.timing == "ttft"
    assert estimate.cold_calls == 2
    assert estimate.prefill_tokens_per_s == pytest.approx(2000 / 0.25)
    assert summary.estimated_compute_saved_s == pytest.approx(900 / (2000 / 0.25))
    assert "2 cold call(s)" in estimate.basis


def test_compute_saved_falls_back_to_latency_and_says_it_is_an_upper_bound() -> None:
    summary = summarize([trace(1000, 0, latency=0.5), trace(1000, 500, latency=0.1)])
    assert summary.compute_saved is not None
    assert summary.compute_saved.timing == "latency"
    assert "upper bound" in summary.compute_saved.basis
    assert summary.estimated_compute_saved_s == pytest.approx(500 / 2000)


def test_no_cold_call_means_no_estimate_rather_than_a_guess() -> None:
    summary = summarize([trace(1000, 500), trace(1000, 960)])
    assert summary.estimated_compute_saved_s is None
    assert summary.compute_saved is None


def test_a_run_without_cache_info_says_so_instead_of_reporting_zero_hits() -> None:
    summary = summarize([trace(1000, None), trace(800, None)])
    assert summary.calls_with_cache_info == 0
    assert summary.avg_prefix_cache_hit_rate is None
    assert summary.token_hit_rate is None
    assert summary.note is not None and "--enable-prompt-tokens-details" in summary.note


def test_latency_percentiles_cover_every_call() -> None:
    summary = summarize([trace(10, 0, latency=x / 10) for x in range(1, 11)])
    assert summary.latency_p50_s == pytest.approx(0.55)
    assert summary.latency_p95_s == pytest.approx(0.955)


def test_empty_run_summarizes_to_zero_calls() -> None:
    summary = summarize([])
    assert (summary.calls, summary.latency_p50_s, summary.note) == (0, None, None)


def test_trace_lines_round_trip_and_bad_lines_are_numbered() -> None:
    good = trace(100, 64)
    lines = [good.model_dump_json(), "", "not json", json.dumps({"model": "m"})]
    traces, bad = parse_trace_lines(lines)
    assert traces == [good]
    assert bad == [3, 4]


def test_a_hit_splits_into_local_and_external_tiers_only_when_the_external_part_is_known() -> None:
    measured = Trace(
        model="m",
        prompt_tokens=900,
        completion_tokens=1,
        prefix_cache_hit_tokens=864,
        external_cache_hit_tokens=800,
        cached_tokens_source="usage",
        latency_s=0.1,
    )
    unmeasured = measured.model_copy(update={"external_cache_hit_tokens": None})
    assert (measured.local_cache_hit_tokens, unmeasured.local_cache_hit_tokens) == (64, None)
    summary = summarize([measured, unmeasured])
    assert summary.tokens_saved_by_tier == {"local": 64, "external": 800}
    assert summarize([unmeasured]).tokens_saved_by_tier is None
