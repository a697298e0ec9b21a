"""LMCache P2P hits are counted apart from the engine's. LMCache 0.5.6 counts L2 lookup tokens
per tier only; its one per-adapter counter is of load tasks (`l2_name` label), so P2P's tokens
are told apart from the engine's where the loads say whose they were, and left unsplit (with the
reason) where both loaded."""

from __future__ import annotations

from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters, parse_lmcache_counters
from graph_kvcache_mcp.domain.vllm.chat import CachedTokens, split_lmcache_tiers, window_tiers
from graph_kvcache_mcp.domain.vllm.metrics import MetricsDelta

# The lines LMCache 0.5.6's Prometheus exporter writes for its per-adapter load counter (the
# name checked against a real server in tests/integration/connectors/test_lmcache_server.py).
EXPOSITION = """# TYPE lmcache_mp_lookup_hit_l2_tokens_total counter
lmcache_mp_lookup_hit_l2_tokens_total{cache_salt="",model_name="a"} 1536.0
# TYPE lmcache_mp_l2_load_completed_requests_total counter
lmcache_mp_l2_load_completed_requests_total{l2_name="native_plugin"} 4.0
lmcache_mp_l2_load_completed_requests_total{l2_name="p2p"} 3.0
"""


def call(external: int) -> CachedTokens:
    return CachedTokens(hit_tokens=external, source="usage", external_tokens=external)


def test_the_p2p_adapters_loads_are_read_into_their_own_field() -> None:
    counters = parse_lmcache_counters(EXPOSITION)
    assert (counters.l2_loads, counters.p2p_loads) == (7, 3)
    assert counters.l2_hit_tokens == 1536
    without = parse_lmcache_counters(EXPOSITION.replace('l2_name="p2p"', 'l2_name="resp"'))
    assert (without.l2_loads, without.p2p_loads) == (7, 0)


def test_a_call_served_by_p2p_alone_counts_its_l2_tokens_as_p2p_not_the_engines() -> None:
    moved = LmcacheCounters(lookups=1, l1_hit_tokens=0, l2_hit_tokens=1536, l2_loads=1, p2p_loads=1)
    split = split_lmcache_tiers(call(1536), moved)
    assert (split.l1_tokens, split.l2_tokens, split.p2p_tokens) == (0, 0, 1536)


def test_a_call_served_by_the_engine_has_no_p2p_part() -> None:
    moved = LmcacheCounters(lookups=1, l1_hit_tokens=0, l2_hit_tokens=1536, l2_loads=1, p2p_loads=0)
    split = split_lmcache_tiers(call(1536), moved)
    assert (split.l1_tokens, split.l2_tokens, split.p2p_tokens) == (0, 1536, 0)


def test_a_call_both_loaded_for_is_left_unsplit_with_the_reason() -> None:
    moved = LmcacheCounters(
        lookups=1, l1_hit_tokens=256, l2_hit_tokens=1280, l2_loads=2, p2p_loads=1
    )
    split = split_lmcache_tiers(call(1536), moved)
    assert split.l1_tokens == 256
    assert split.l2_tokens is None and split.p2p_tokens is None
    assert split.note is not None and "cannot be split" in split.note and "P2P" in split.note


def test_a_window_names_p2p_as_its_own_tier_and_the_parts_still_sum() -> None:
    window = MetricsDelta(
        model_name="m", prefix_cache_hits_tokens=2048, external_prefix_cache_hits_tokens=1536
    )
    p2p_only = LmcacheCounters(
        lookups=2, l1_hit_tokens=0, l2_hit_tokens=1536, l2_loads=2, p2p_loads=2
    )
    tiers = window_tiers(window, p2p_only)
    assert tiers == {
        "local": 2048,
        "external": 1536,
        "lmcache_l1": 0,
        "lmcache_l2": 0,
        "lmcache_p2p": 1536,
    }
    mixed = p2p_only.model_copy(update={"l2_loads": 3})
    assert window_tiers(window, mixed) == {"local": 2048, "external": 1536}
