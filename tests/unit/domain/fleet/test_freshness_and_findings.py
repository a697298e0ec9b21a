"""Sequence tracking, the freshness report, sharing findings and the pressure ranking."""

from __future__ import annotations

from typing import Any

from graph_kvcache_mcp.domain.fleet.findings import (
    InstanceFacts,
    fleet_split,
    pressure_ranking,
    sharing_findings,
    source_split,
)
from graph_kvcache_mcp.domain.fleet.freshness import SequenceTracker, freshness_of


def test_numbers_classify_as_next_gap_duplicate_or_reset() -> None:
    tracker = SequenceTracker()
    assert tracker.classify(0, 1.0) == "next"
    tracker.applied(0, 1.0, now=1.0)
    tracker.applied(1, 2.0, now=2.0)
    assert tracker.classify(2, 3.0) == "next"
    assert tracker.classify(5, 3.0) == "gap"
    assert tracker.classify(1, 2.0) == "duplicate"  # the same batch again (replay overlap)
    assert tracker.classify(0, 9.0) == "reset"  # a number seen before, another batch: restart
    assert tracker.classify(1, 9.0) == "reset"


def test_freshness_says_live_partial_unreachable_or_no_feed() -> None:
    tracker = SequenceTracker()
    assert freshness_of(tracker, now=5.0, reachable=True).state == "never_heard"
    tracker.synced = True
    assert freshness_of(tracker, now=5.0, reachable=True).state == "live"
    tracker.applied(3, 2.0, now=2.0)
    fresh = freshness_of(tracker, now=5.0, reachable=True)
    assert (fresh.state, fresh.last_seq, fresh.last_event_age_s) == ("live", 3, 3.0)
    tracker.history_complete = False
    assert freshness_of(tracker, now=5.0, reachable=True).state == "partial"
    assert freshness_of(tracker, now=5.0, reachable=False).state == "unreachable"
    assert freshness_of(None, now=5.0, reachable=True).state == "no_feed"


def facts(name: str, **values: Any) -> InstanceFacts:
    base: dict[str, Any] = {
        "name": name,
        "reachable": True,
        "model": "m",
        "version": "0.32.0",
        "block_size": 32,
        "hash_algo": "sha256",
        "prefix_caching": True,
        "feed": freshness_of(SequenceTracker(synced=True), now=0.0, reachable=True),
    }
    return InstanceFacts(**{**base, **values})


def test_a_block_size_or_hash_mismatch_is_an_error_with_a_fix() -> None:
    found = sharing_findings([facts("a"), facts("b", block_size=64, hash_algo="xxhash")])
    by_code = {f.code: f for f in found}
    assert set(by_code) == {"block_size_mismatch", "hash_algo_mismatch"}
    assert by_code["block_size_mismatch"].severity == "error"
    assert "--block-size" in by_code["block_size_mismatch"].fix
    assert "32 on a; 64 on b" in by_code["block_size_mismatch"].message


def test_no_feed_prefix_caching_off_and_unreachable_are_findings() -> None:
    found = sharing_findings(
        [
            facts("a", feed=freshness_of(None, now=0.0, reachable=True)),
            facts("b", prefix_caching=False),
            facts("c", reachable=False, reason="refused"),
        ]
    )
    assert [(f.code, f.instances) for f in found] == [
        ("events_off", ["a"]),
        ("prefix_caching_off", ["b"]),
        ("unreachable", ["c"]),
    ]
    assert sharing_findings([facts("a"), facts("b")]) == []


def test_pressure_ranks_preemptions_then_waiting_then_kv_usage() -> None:
    ranked = pressure_ranking(
        [
            facts("calm", kv_usage=0.9),
            facts("queued", waiting=3),
            facts("preempting", preemptions=2),
            facts("down", reachable=False),
        ]
    )
    assert [r.name for r in ranked] == ["preempting", "queued", "calm"]


def test_source_splits_move_over_a_window_and_sum_for_the_fleet() -> None:
    before = {"local_compute": 100, "local_cache_hit": 0, "external_kv_transfer": 0}
    after = {"local_compute": 150, "local_cache_hit": 30, "external_kv_transfer": 20}
    split = source_split(before, after)
    assert split is not None
    assert (split.prompt_tokens, split.hit_rate, split.tier_payoff) == (100, 0.5, 0.2)
    backwards = source_split(after, before)
    assert backwards is not None and backwards.counter_reset
    assert source_split(None, None) is None
    total = fleet_split([split, split])
    assert (total.prompt_tokens, total.from_tier) == (200, 40)
