"""LMCache's L1/L2 split of a call (and of a vllm_metrics window) counts only what vLLM took from
the connector: LMCache counts every chunk it holds, also those vLLM already had locally, so its
hits are capped at vLLM's external hit and the parts always sum to it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.vllm.chat import (
    CachedTokens,
    split_lmcache_tiers,
    tiers_taken,
    window_tiers,
)
from graph_kvcache_mcp.domain.vllm.metrics import MetricsDelta, MetricsSnapshot, TtftSummary
from graph_kvcache_mcp.state import Snapshots, VllmBaseline


def call(external: int) -> CachedTokens:
    return CachedTokens(hit_tokens=1536, source="usage", external_tokens=external)


def test_a_warm_call_served_by_vllm_alone_has_no_tier_part() -> None:
    # The case: external 0, while LMCache counted 1,280 L1 tokens it held.
    moved = LmcacheCounters(lookups=1, l1_hit_tokens=1280, l2_hit_tokens=0)
    split = split_lmcache_tiers(call(0), moved)
    assert (split.l1_tokens, split.l2_tokens) == (0, 0)


def test_the_tail_vllm_took_is_l2_first_then_l1() -> None:
    # LMCache held 1,024 in L1 then 512 in L2; vLLM had 768 locally and took the last 768.
    moved = LmcacheCounters(lookups=1, l1_hit_tokens=1024, l2_hit_tokens=512)
    split = split_lmcache_tiers(call(768), moved)
    assert (split.l1_tokens, split.l2_tokens) == (256, 512)


def test_a_server_that_found_less_than_vllm_took_leaves_the_split_unknown() -> None:
    moved = LmcacheCounters(lookups=1, l1_hit_tokens=64, l2_hit_tokens=0)
    split = split_lmcache_tiers(call(256), moved)
    assert split.l1_tokens is None and split.l2_tokens is None
    assert split.note is not None and "found 64 tokens but vLLM took 256" in split.note


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 20_000))
def test_the_parts_always_sum_to_vllms_external_hit(l1: int, l2: int, external: int) -> None:
    taken = tiers_taken(l1, l2, external)
    if l1 + l2 < external:
        assert taken is None
    else:
        assert taken is not None and sum(taken) == external and min(taken) >= 0
        assert taken[1] <= l2 and taken[0] <= l1


def test_a_windows_tiers_sum_to_its_hits_with_lmcache_capped_at_the_external_part() -> None:
    window = MetricsDelta(
        model_name="m", prefix_cache_hits_tokens=97_248, external_prefix_cache_hits_tokens=25_596
    )
    moved = LmcacheCounters(lookups=80, l1_hit_tokens=110_000, l2_hit_tokens=12_000)
    tiers = window_tiers(window, moved)
    assert tiers == {
        "local": 97_248,
        "external": 25_596,
        "lmcache_l1": 25_596 - 12_000,
        "lmcache_l2": 12_000,
    }
    assert window_tiers(window, None) == {"local": 97_248, "external": 25_596}
    reset = MetricsDelta(model_name="m", counter_reset=True)
    assert window_tiers(reset, moved) is None


def test_a_vllm_id_carries_the_lmcache_counters_too() -> None:
    ttft = TtftSummary(count=0, sum_s=0.0, mean_s=None, p50_s=None, p95_s=None)  # no request yet
    snapshot = MetricsSnapshot(model_name="m", prompt_tokens=5, ttft=ttft, ttft_buckets=[(0.1, 2)])
    kept = VllmBaseline(snapshot, LmcacheCounters(lookups=3, l1_hit_tokens=64))
    store = Snapshots("vllm", lambda: b"k" * 32, VllmBaseline.dump, VllmBaseline.load)
    snapshot_id = store.keep(kept)
    assert snapshot_id is not None and store.find(snapshot_id, "vllm_metrics") == kept
