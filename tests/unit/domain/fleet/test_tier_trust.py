"""The L1 answer's trust marks: a coordinator younger than the server, a predecessor's lingering
registration, start times that are not exported."""

from __future__ import annotations

from graph_kvcache_mcp.domain.fleet.tier_trust import (
    Predecessor,
    Registration,
    l1_distrust,
    own_registration,
    predecessor_reason,
    process_start_s,
    unmanaged_distrust,
)

EXPOSITION = """# HELP process_start_time_seconds Start time of the process.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.79633456667e+09
lmcache_mp_event_bus_queue_depth 0.0
"""


def test_the_start_time_is_read_from_the_exposition_and_none_when_absent() -> None:
    assert process_start_s(EXPOSITION) == 1796334566.67
    assert process_start_s("lmcache_mp_event_bus_queue_depth 0.0\n") is None
    assert process_start_s("process_start_time_seconds nan-ish\n") is None


def test_a_coordinator_older_than_the_server_is_trusted() -> None:
    assert l1_distrust(100.0, 200.0) is None
    assert l1_distrust(201.0, 200.0) is None  # within the clock slack: started together


def test_a_coordinator_restarted_after_the_server_is_untrusted_with_the_reason() -> None:
    reason = l1_distrust(500.0, 200.0)
    assert reason is not None and reason.startswith("untrusted")
    assert "checkpoint" in reason and "lower bound" in reason


def test_an_unknown_start_time_cannot_rule_out_a_restart() -> None:
    for coordinator, server, who in ((None, 1.0, "coordinator"), (1.0, None, "LMCache server")):
        reason = l1_distrust(coordinator, server)
        assert reason is not None and who in reason and reason.startswith("untrusted")


def test_the_newest_registration_at_the_address_is_the_running_servers() -> None:
    old = Registration(instance_id="old", registered_at=100.0)
    new = Registration(instance_id="new", registered_at=300.0)
    assert own_registration([old, new], server_started_s=299.0) == new
    assert own_registration([old, new], server_started_s=None) == new
    assert own_registration([], server_started_s=10.0) is None


def test_only_a_predecessors_registration_is_never_taken_for_the_running_server() -> None:
    old = Registration(instance_id="old", registered_at=100.0)
    found = own_registration([old], server_started_s=250.0)
    assert found == Predecessor(instance_id="old")
    reason = predecessor_reason("http://127.0.0.1:8080", found)
    assert reason.startswith("unknown") and "old" in reason and "instance timeout" in reason


def test_the_id_the_server_reports_picks_its_registration_and_no_forged_one() -> None:
    ours = Registration(instance_id="ours", registered_at=100.0)
    forged = Registration(instance_id="forged", registered_at=500.0)  # newer, at our address
    assert own_registration([ours, forged], 90.0) == forged  # the rule for unreporting servers
    assert own_registration([ours, forged], 90.0, "ours") == ours
    assert own_registration([forged], 90.0, "ours") is None  # ours deleted: not registered
    assert own_registration([], None, "ours") is None


def test_a_coordinator_we_did_not_start_is_untrusted_and_says_how_to_opt_in() -> None:
    reason = unmanaged_distrust("http://127.0.0.1:9000")
    assert reason.startswith("untrusted: ") and "http://127.0.0.1:9000" in reason
    assert "GRAPH_KVCACHE_TRUST_UNMANAGED_COORDINATOR=1" in reason
