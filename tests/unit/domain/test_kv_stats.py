from __future__ import annotations

import pytest

from graph_kvcache_mcp.domain.engine.kv_stats import (
    ClientCounters,
    EngineStats,
    build_report,
    normalize_engine_stats,
    stats_delta,
    stats_note,
)

MEMORY = {
    "backend": "memory",
    "dedup_hits": 1,
    "dedup_savings_bytes": 11,
    "get_hits": 0,
    "get_misses": 0,
    "logical_bytes": 22,
    "resident_bytes": 11,
    "stale_retired": 0,
    "total_refs": 2,
    "unique_blocks": 1,
}
DURABLE = {
    "backend": "durable",
    "dedup_hits": 2,
    "durable": True,
    "get_hits": 3,
    "get_misses": 1,
    "hit_rate": 0.75,
    "instance": "kvcache",
    "put_new": 5,
    "stale_missed": 0,
}


def test_memory_stats_report_unknown_get_counters_as_none_not_zero() -> None:
    stats = normalize_engine_stats(MEMORY)
    assert stats.backend == "memory"
    assert (stats.get_hits, stats.get_misses, stats.put_new) == (None, None, None)
    assert (stats.unique_blocks, stats.logical_bytes, stats.resident_bytes) == (1, 22, 11)


def test_durable_stats_report_occupancy_as_none() -> None:
    stats = normalize_engine_stats(DURABLE)
    assert stats.backend == "durable" and stats.instance == "kvcache"
    assert (stats.unique_blocks, stats.resident_bytes, stats.logical_bytes) == (None, None, None)
    assert (stats.get_hits, stats.get_misses, stats.put_new) == (3, 1, 5)


def test_hit_rate_comes_from_the_engine_when_it_counts_and_from_the_client_otherwise() -> None:
    client = ClientCounters(gets=4, get_hits=1, get_misses=3)
    durable = build_report(normalize_engine_stats(DURABLE), client)
    assert (durable.hit_rate, durable.hit_rate_source) == (0.75, "engine")
    memory = build_report(normalize_engine_stats(MEMORY), client)
    assert (memory.hit_rate, memory.hit_rate_source) == (0.25, "client")
    assert memory.dedup_ratio == 2.0
    assert memory.dedup_hit_share == 0.5


def test_no_gets_anywhere_means_no_hit_rate() -> None:
    report = build_report(normalize_engine_stats(MEMORY), ClientCounters())
    assert report.hit_rate is None and report.hit_rate_source is None


def test_non_integer_counters_are_rejected() -> None:
    with pytest.raises(ValueError, match="unique_blocks"):
        normalize_engine_stats({**MEMORY, "unique_blocks": "many"})


def test_delta_subtracts_counters_and_survives_a_restart() -> None:
    before = EngineStats(backend="durable", get_hits=10, put_new=4)
    after = EngineStats(backend="durable", get_hits=13, put_new=1)
    moved = stats_delta(before, after)
    assert moved.get_hits == 3
    assert moved.put_new == 1  # counter went down: the engine restarted
    assert moved.unique_blocks is None


def test_stats_note_names_the_null_fields_and_a_restart_since_a_snapshot() -> None:
    durable = {"backend": "durable", "dedup_hits": 0, "get_hits": 4, "get_misses": 1}
    earlier = normalize_engine_stats({**durable, "put_new": 3})
    now = normalize_engine_stats({**durable, "put_new": 1})
    quiet = stats_note(earlier)
    assert quiet is not None and "restarted" not in quiet
    assert quiet.startswith("null = not reported by the durable backend: unique_blocks")
    restarted_note = stats_note(now, since=earlier)
    assert restarted_note is not None and "the engine restarted after" in restarted_note
    grown = stats_note(normalize_engine_stats({**durable, "put_new": 5}), since=earlier)
    assert grown is not None and "restarted" not in grown
