"""--read-only: no tool that writes, starts or stops is listed or works; kv_probe never writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, MCPError
from mcp.types import INVALID_PARAMS

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.private import write_private
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheState
from graph_kvcache_mcp.connectors.processes.identity import ProcessRecord
from graph_kvcache_mcp.connectors.processes.leases import Lease
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.kv.probe import KvProbeOut
from graph_kvcache_mcp.services.stack.views import LmcacheStatusOut
from graph_kvcache_mcp.services.vllm.views import VllmStatusOut
from graph_kvcache_mcp.tools.compat import GraphKvcacheOut
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, b64, call_error, call_ok, fresh_key, write_counters
from tests.support.vllm_records import vllm_record


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


@pytest.mark.parametrize(("read_only", "kept"), [(True, True), (False, False)])
async def test_only_a_writable_server_removes_a_stale_vllm_record(
    tmp_path: Path, read_only: bool, kept: bool
) -> None:
    """vllm_status finds the recorded vLLM gone: a read-only server reports it and changes
    nothing on disk; a writable one tidies the stale record away."""
    record = ProcessRecord(  # a pid that exited: the record is stale
        pid=_exited_pid(), start_ticks=1, command=("python",), started_at=0.0, log_path="x"
    )
    state = vllm_record(record, port=free_port(), base_url="http://127.0.0.1:1/v1")
    state_path = tmp_path / "vllm" / "state.json"
    state_path.parent.mkdir(mode=0o700)
    state_path.write_text(state.model_dump_json())
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm",), read_only=read_only)
    async with Client(build_server(settings)) as client:
        status = VllmStatusOut.model_validate(await call_ok(client, "vllm_status", {}))
    assert not status.running
    assert state_path.exists() is kept


@pytest.mark.parametrize(("read_only", "kept"), [(True, True), (False, False)])
async def test_only_a_writable_server_removes_a_stale_lmcache_record_and_lease(
    tmp_path: Path, read_only: bool, kept: bool
) -> None:
    """lmcache_status finds the recorded server and a session's lease stale: a read-only server
    reports it and changes nothing on disk; a writable one tidies both away."""
    pid = _exited_pid()
    record = ProcessRecord(
        pid=pid, start_ticks=1, command=("python",), started_at=0.0, log_path="x"
    )
    state = LmcacheState(
        process=record, host="127.0.0.1", port=1, http_port=2, http_url="http://127.0.0.1:2"
    )
    managed = ManagedLmcache(tmp_path)
    managed.state_file.write(state)
    lease = managed.leases.directory / f"{pid}-gone.json"
    write_private(lease, Lease(pid=pid, start_ticks=1, taken_at=0.0).model_dump_json())
    settings = Settings.build(data_dir=tmp_path, toolsets=("lmcache",), read_only=read_only)
    async with Client(build_server(settings)) as client:
        status = LmcacheStatusOut.model_validate(await call_ok(client, "lmcache_status", {}))
    assert (status.running, status.leases, status.holds_lease) == (False, [], False)
    assert managed.state_file.path.exists() is kept and lease.exists() is kept


def _exited_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid
