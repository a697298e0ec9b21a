"""`fleet status`'s text for fleet memory: one line per LMCache server, the shared L2 once."""

from __future__ import annotations

from graph_kvcache_mcp.commands.fleet import _describe_memory
from graph_kvcache_mcp.domain.fleet.memory import FleetMemory, PoolUse, ServerMemory

GIB = 1024**3


def test_each_server_gets_a_line_and_the_engine_one_line() -> None:
    memory = FleetMemory(
        servers=[
            ServerMemory(
                server="http://127.0.0.1:8080",
                instances=["a", "b"],
                l1=PoolUse(
                    tier="l1",
                    backend="dram",
                    used_bytes=GIB,
                    capacity_bytes=4 * GIB,
                    usage_ratio=0.25,
                ),
            ),
            ServerMemory(server="http://127.0.0.1:8081", instances=["c"], reason="not checked"),
        ],
        shared_l2=[PoolUse(tier="l2", backend="EngineL2Client", used_bytes=2 * GIB)],
    )
    assert _describe_memory(memory) == [
        "LMCache http://127.0.0.1:8080 (a, b): L1 1.00 GiB of 4.00 GiB (25.0%)",
        "LMCache http://127.0.0.1:8081 (c): L1 not checked",
        "shared L2 EngineL2Client: 2.00 GiB (no capacity declared)",
    ]
    assert _describe_memory(None) == []
