"""The console script over stdio, as hosts launch it: initialize, list tools, call tools; and the
embedded engine's lifecycle when the host disconnects or signals the server."""

from __future__ import annotations

import signal
from pathlib import Path

from mcp import Client, StdioServerParameters

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.services.kv.probe import KvProbeOut
from graph_kvcache_mcp.services.stack.views import EngineStatusOut
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, call_ok
from tests.support.processes import (
    engine_gone,
    engine_session,
    running_engine_state,
    venv_script,
    wait_until,
)


@MODES
async def test_console_script_without_a_command_serves_stdio_and_probes_the_configured_engine(
    memory_engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    server = StdioServerParameters(
        command=str(venv_script("graph-kvcache-mcp")),
        args=[],
        env={
            "EPISTEMIC_GRAPH_KVCACHE_URL": memory_engine.base_url,
            "EPISTEMIC_GRAPH_KVCACHE_TOKEN": memory_engine.token.get_secret_value(),
            "GRAPH_KVCACHE_DATA_DIR": str(tmp_path),
        },
    )
    async with Client(server, mode=mode) as client:
        info = client.server_info
        names = {tool.name for tool in (await client.list_tools()).tools}
        probe = KvProbeOut.model_validate(await call_ok(client, "kv_probe", {"samples": 3}))
    assert info is not None and info.name == "graph-kvcache-mcp"
    assert {"kv_probe", "kv_get", "kv_put", "toolsets", "engine_status"} <= names
    assert probe.passed and probe.base_url == memory_engine.base_url
    assert running_engine_state(tmp_path) is None  # a configured URL starts nothing


async def test_embedded_engine_is_stopped_when_the_host_disconnects(tmp_path: Path) -> None:
    server = StdioServerParameters(
        command=str(venv_script("graph-kvcache-mcp")),
        args=["--data-dir", str(tmp_path)],
    )
    async with Client(server) as client:
        probe = KvProbeOut.model_validate(await call_ok(client, "kv_probe", {"samples": 3}))
        status = EngineStatusOut.model_validate(await call_ok(client, "engine_status", {}))
        state = running_engine_state(tmp_path)
    assert probe.passed and status.started_by_this_server and status.stops_on_exit
    assert state is not None and state.process.pid == status.pid
    wait_until(lambda: engine_gone(state), timeout_s=15, what="the engine to stop")


def test_sigterm_to_the_server_stops_the_engine_it_started(tmp_path: Path) -> None:
    with engine_session(tmp_path) as server:
        state = running_engine_state(tmp_path)
        assert state is not None
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
        wait_until(lambda: engine_gone(state), timeout_s=5, what="the engine to stop")


async def test_keep_engine_leaves_the_engine_running_for_the_next_session(tmp_path: Path) -> None:
    server = StdioServerParameters(
        command=str(venv_script("graph-kvcache-mcp")),
        args=["--keep-engine", "--data-dir", str(tmp_path)],
    )
    try:
        async with Client(server) as client:
            first = EngineStatusOut.model_validate(await call_ok(client, "engine_start", {}))
        async with Client(server) as client:
            second = EngineStatusOut.model_validate(await call_ok(client, "engine_status", {}))
        assert first.started_by_this_server and not first.stops_on_exit
        assert second.running and second.pid == first.pid
        assert not second.started_by_this_server  # the second session only reused it
    finally:
        ManagedEngine(tmp_path).stop(term_wait_s=5.0)
