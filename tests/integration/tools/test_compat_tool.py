"""graph_kvcache (the incumbent's action tool) against real engines, in both protocol eras."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.tools.compat import GraphKvcacheOut
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, b64, call_ok, fresh_key


async def _action(client: Client, **arguments: str) -> GraphKvcacheOut:
    return GraphKvcacheOut.model_validate(await call_ok(client, "graph_kvcache", arguments))


@MODES
async def test_graph_kvcache_put_then_get_keeps_the_incumbent_meanings(
    engine: RunningEngine, mode: str
) -> None:
    key, value = fresh_key("compat"), os.urandom(64)
    async with Client(build_server(engine.settings), mode=mode) as client:
        miss = await _action(client, action="get", key=key)
        put = await _action(client, action="put", key=key, value_b64=b64(value))
        again = await _action(client, action="put", key=key, value_b64=b64(b"other"))
        hit = await _action(client, action="get", key=key)
    assert (miss.reachable, miss.hit, miss.value_b64) == (True, False, None)
    assert (put.stored, put.state, put.size_bytes) == (True, "stored_new", 64)
    assert (again.stored, again.state) == (True, "already_present")
    assert again.note is not None and "first value" in again.note
    assert hit.hit is True and base64.b64decode(hit.value_b64 or "") == value


@MODES
async def test_graph_kvcache_contains_and_exists_answer_present(
    engine: RunningEngine, mode: str
) -> None:
    stored, absent = fresh_key("compat"), fresh_key("absent")
    engine.sync_client().put(stored, b"here")
    async with Client(build_server(engine.settings), mode=mode) as client:
        answers = [
            (await _action(client, action=action, key=key)).present
            for action in ("contains", "exists")
            for key in (stored, absent)
        ]
    assert answers == [True, False, True, False]


@MODES
async def test_graph_kvcache_stats_reports_the_incumbent_counters_with_null_for_unreported(
    engine: RunningEngine, mode: str
) -> None:
    async with Client(build_server(engine.settings), mode=mode) as client:
        out = await _action(client, action="stats")
    assert out.reachable and out.backend == engine.backend and out.stats is not None
    counters = out.stats.model_dump()
    assert set(counters) == {
        "unique_blocks",
        "total_refs",
        "resident_bytes",
        "logical_bytes",
        "dedup_savings_bytes",
        "dedup_hits",
        "get_hits",
        "get_misses",
    }
    if engine.backend == "memory":  # counts occupancy, never gets
        assert counters["unique_blocks"] is not None and counters["get_hits"] is None
    else:  # counts gets, not occupancy
        assert counters["get_hits"] is not None and counters["unique_blocks"] is None


@MODES
async def test_graph_kvcache_get_of_a_value_over_64_kib_returns_no_bytes_and_says_how(
    engine: RunningEngine, mode: str
) -> None:
    key = fresh_key("compat")
    engine.sync_client().put(key, os.urandom(64 * 1024 + 1))
    async with Client(build_server(engine.settings), mode=mode) as client:
        out = await _action(client, action="get", key=key)
    assert (out.hit, out.value_b64, out.size_bytes) == (True, None, 64 * 1024 + 1)
    assert out.note is not None and "kv_save" in out.note


@MODES
async def test_graph_kvcache_reports_unreachable_with_a_reason(mode: str, tmp_path: Path) -> None:
    port = free_port()
    settings = Settings.build(
        kv_url=f"http://127.0.0.1:{port}", data_dir=tmp_path, toolsets=("compat",)
    )
    async with Client(build_server(settings), mode=mode) as client:
        outs = [
            await _action(client, action="stats"),
            await _action(client, action="get", key="k"),
            await _action(client, action="put", key="k", value_b64=b64(b"v")),
            await _action(client, action="contains", key="k"),
        ]
    for out in outs:
        assert out.reachable is False and out.reason is not None and str(port) in out.reason
