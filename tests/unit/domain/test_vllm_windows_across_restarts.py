"""Windows across vLLM restarts: a managed stop records the process's final counts, so a window
across it counts both processes; a restart whose counts are unknown is flagged, never a part and
never a negative number."""

from __future__ import annotations

from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot, parse_snapshot, window
from graph_kvcache_mcp.services.fleet.operations import FleetCounters
from graph_kvcache_mcp.state import Snapshots
from tests.support.expositions import captured, widen

MODEL = "m"
CAPTURED_START = "process_start_time_seconds 1.79599045555e+09"


def scrape(factor: int, started: float) -> MetricsSnapshot:
    """The captured counters × `factor`, from a process that started at `started`."""
    text = widen(captured(), [(MODEL, "0", factor)])
    assert CAPTURED_START in text
    text = text.replace(CAPTURED_START, f"process_start_time_seconds {started!r}")
    return parse_snapshot(text, MODEL)


def test_the_process_start_time_is_read_whichever_model_is_asked_for() -> None:
    assert scrape(1, 100.0).process_start_time_s == 100.0
    assert parse_snapshot(captured(), None).process_start_time_s == 1.79599045555e09


def test_a_window_in_one_process_is_the_plain_difference() -> None:
    before, after = scrape(1, 100.0), scrape(3, 100.0)
    moved = window(before, after)
    assert moved.prompt_tokens == 2 * (before.prompt_tokens or 0) > 0
    assert moved.restarts == 0 and not moved.counter_reset


def test_a_managed_restart_counts_the_stopped_process_tail_and_the_new_process() -> None:
    before, final, after = scrape(1, 100.0), scrape(4, 100.0), scrape(2, 200.0)
    one = before.prompt_tokens or 0
    moved = window(before, after, [final])
    assert moved.prompt_tokens == (4 - 1) * one + 2 * one  # never just the new process's 2x
    assert moved.prefix_cache_hits_tokens == 5 * (before.prefix_cache_hits_tokens or 0)
    assert moved.requests_with_first_token == 5 * (before.ttft.count if before.ttft else 0)
    assert moved.restarts == 1 and not moved.counter_reset
    assert moved.ttft is not None and moved.ttft.p50_s is not None  # buckets carried too


def test_two_managed_restarts_count_the_process_in_between_whole() -> None:
    before, after = scrape(1, 100.0), scrape(1, 300.0)
    finals = [scrape(2, 200.0), scrape(2, 100.0), scrape(9, 50.0)]  # 50: ended before the window
    moved = window(before, after, finals)
    assert moved.prompt_tokens == (1 + 2 + 1) * (before.prompt_tokens or 0)
    assert moved.restarts == 2


def test_an_unmanaged_restart_is_flagged_even_when_no_counter_went_back() -> None:
    # The case: as much traffic after the restart as before, so every counter is
    # higher: without the start time this read as a plain window that lost the first half.
    before, after = scrape(1, 100.0), scrape(2, 200.0)
    moved = window(before, after, [scrape(5, 150.0)])  # another process's record: no help
    assert moved.counter_reset is True and moved.restarts == 0
    assert moved.prompt_tokens is None and moved.prefix_cache_hits_tokens is None
    assert moved.requests_with_first_token is None


def test_a_restart_without_start_times_is_still_caught_by_a_counter_going_back() -> None:
    before = scrape(3, 100.0).model_copy(update={"process_start_time_s": None})
    after = scrape(1, 200.0)
    moved = window(before, after)
    assert moved.counter_reset is True and moved.prompt_tokens is None


def test_a_baseline_carried_in_a_since_id_gives_the_same_window() -> None:
    store = Snapshots(
        "vllm", lambda: b"k" * 32, MetricsSnapshot.baseline, MetricsSnapshot.model_validate
    )
    before, after = scrape(1, 100.0), scrape(3, 100.0)
    snapshot_id = store.keep(before)
    assert snapshot_id is not None and len(snapshot_id) < 2_000
    assert window(store.find(snapshot_id, "vllm_metrics"), after) == window(before, after)


def test_a_fleet_id_carries_every_instances_counters() -> None:
    counters = FleetCounters(12.5, {"a": scrape(1, 100.0), "b": None})
    store = Snapshots(
        "fleet", lambda: b"k" * 32, FleetCounters.baseline, FleetCounters.from_baseline
    )
    snapshot_id = store.keep(counters)
    assert snapshot_id is not None
    back = store.find(snapshot_id, "fleet_effectiveness")
    assert back.taken_at == 12.5 and back.snapshots["b"] is None
    after = scrape(2, 100.0)
    a = back.snapshots["a"]
    assert a is not None and window(a, after) == window(scrape(1, 100.0), after)


def test_a_fleet_id_carries_each_instances_lmcache_counters_and_an_older_id_still_reads() -> None:
    server = LmcacheCounters(lookups=4, l1_hit_tokens=1_280, l2_hit_tokens=512)
    counters = FleetCounters(12.5, {"a": scrape(1, 100.0)}, {"a": server})
    store = Snapshots(
        "fleet", lambda: b"k" * 32, FleetCounters.baseline, FleetCounters.from_baseline
    )
    snapshot_id = store.keep(counters)
    assert snapshot_id is not None
    assert store.find(snapshot_id, "fleet_effectiveness").lmcache == {"a": server}
    older = {k: v for k, v in counters.baseline().items() if k != "lmcache"}
    assert FleetCounters.from_baseline(older).lmcache == {}
