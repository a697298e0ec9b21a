"""--read-only: no tool that writes, starts or stops is listed or works; kv_probe never writes."""

from __future__ import annotations

import pytest
from mcp import Client, MCPError
from mcp.types import INVALID_PARAMS

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.kv_probe import KvProbeOut
from graph_kvcache_mcp.tools.compat import GraphKvcacheOut
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, b64, call_error, call_ok, fresh_key, write_counters


def _read_only(engine: RunningEngine) -> Settings:
    return engine.settings.model_copy(update={"read_only": True})


@MODES
async def test_read_only_lists_only_read_only_tools(engine: RunningEngine, mode: str) -> None:
    async with Client(build_server(_read_only(engine)), mode=mode) as client:
        tools = (await client.list_tools()).tools
    kv_and_engine = {
        "kv_stats",
        "kv_probe",
        "kv_get",
        "kv_exists",
        "graph_kvcache",
        "engine_status",
    }
    assert kv_and_engine <= {tool.name for tool in tools}
    assert not {"kv_put", "kv_save", "engine_start", "engine_stop"} & {t.name for t in tools}
    for tool in tools:
        assert tool.annotations is not None and tool.annotations.read_only_hint is True, tool.name


@MODES
async def test_read_only_refuses_every_writer_and_stores_nothing(
    engine: RunningEngine, mode: str
) -> None:
    key = fresh_key("ro")
    before = write_counters(engine.sync_client())
    async with Client(build_server(_read_only(engine)), mode=mode) as client:
        refusals: list[MCPError] = []
        for tool, arguments in (
            ("kv_put", {"key": key, "value_b64": b64(b"x")}),
            ("engine_start", {}),
        ):
            with pytest.raises(MCPError) as refused:
                await client.call_tool(tool, arguments)
            refusals.append(refused.value)
        compat = await call_error(
            client, "graph_kvcache", {"action": "put", "key": key, "value_b64": b64(b"x")}
        )
        probe = KvProbeOut.model_validate(await call_ok(client, "kv_probe", {"samples": 3}))
        stats = GraphKvcacheOut.model_validate(
            await call_ok(client, "graph_kvcache", {"action": "stats"})
        )
    assert [r.error.code for r in refusals] == [INVALID_PARAMS, INVALID_PARAMS]
    assert all("this server is read-only" in r.error.message for r in refusals)
    assert "this server is read-only" in compat and "put is not available" in compat
    assert probe.passed and [c.name for c in probe.checks] == ["reachable", "auth", "latency"]
    assert stats.reachable
    assert write_counters(engine.sync_client()) == before


async def test_read_only_kv_get_points_to_the_cli_for_large_values(
    memory_engine: RunningEngine,
) -> None:
    key = fresh_key("ro-big")
    memory_engine.sync_client().put(key, b"x" * 100)
    async with Client(build_server(_read_only(memory_engine))) as client:
        out = await call_ok(
            client, "kv_get", {"keys": [key], "include_value": True, "max_inline_bytes": 10}
        )
    note = out["results"][0]["note"]
    assert "graph-kvcache-mcp kv get" in note and "kv_save" not in note
