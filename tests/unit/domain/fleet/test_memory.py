"""Fleet memory from the coordinator's /instances/usage body (shape as lmcache 0.5.6 sends it)."""

from __future__ import annotations

from typing import Any

from graph_kvcache_mcp.domain.fleet.findings import InstanceFacts, pressure_ranking
from graph_kvcache_mcp.domain.fleet.freshness import Freshness
from graph_kvcache_mcp.domain.fleet.memory import (
    FleetMemory,
    describe_pool,
    l1_pressure,
    server_memory,
    shared_pools,
)

GIB = 1024**3
USAGE: dict[str, Any] = {
    "instances": [
        {
            "instance_id": "mp-a",
            "registered": True,
            "declared_capacity": True,
            "modules": [
                {
                    "tier": "l1",
                    "backend": "dram",
                    "shared": False,
                    "used_bytes": GIB // 2,
                    "capacity_bytes": 2 * GIB,
                    "usage_ratio": 0.25,
                }
            ],
        },
        {"instance_id": "mp-b", "registered": True, "declared_capacity": False, "modules": []},
    ],
    "shared_modules": [
        {
            "tier": "l2",
            "backend": "EngineL2Client",
            "shared": True,
            "used_bytes": 3 * GIB,
            "capacity_bytes": 0,
            "usage_ratio": None,
        }
    ],
}


def facts(name: str) -> InstanceFacts:
    return InstanceFacts(name=name, reachable=True, feed=Freshness(state="live"))


def test_a_servers_l1_and_the_shared_l2_are_read_once() -> None:
    a = server_memory(USAGE, "mp-a", server="http://127.0.0.1:1", instances=["x", "y"])
    assert a.l1 is not None and (a.l1.used_bytes, a.l1.capacity_bytes) == (GIB // 2, 2 * GIB)
    assert a.l2 == [] and a.reason is None
    (engine,) = shared_pools(USAGE)
    assert (engine.backend, engine.used_bytes, engine.capacity_bytes) == (
        "EngineL2Client",
        3 * GIB,
        None,
    )
    assert describe_pool(engine) == "3.00 GiB (no capacity declared)"
    assert describe_pool(a.l1) == "0.50 GiB of 2.00 GiB (25.0%)"


def test_a_server_the_coordinator_has_no_figures_for_says_so() -> None:
    b = server_memory(USAGE, "mp-b", server="u", instances=["z"])
    assert b.l1 is None
    missing = server_memory(USAGE, "mp-gone", server="u", instances=["z"])
    assert missing.l1 is None and missing.reason and "no memory" in missing.reason


def test_l1_use_breaks_ties_in_the_pressure_ranking_and_is_named() -> None:
    a = server_memory(USAGE, "mp-a", server="u", instances=["busy"])
    memory = FleetMemory(servers=[a], shared_l2=shared_pools(USAGE))
    ranked = pressure_ranking([facts("idle"), facts("busy")], l1_pressure(memory))
    assert [r.name for r in ranked] == ["busy", "idle"]
    assert "LMCache L1 0.50 GiB of 2.00 GiB" in ranked[0].reason
    assert "L1" not in ranked[1].reason
