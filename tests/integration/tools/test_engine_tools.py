"""The embedded default and the engine_* tools, with real engines in private data dirs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.managed_access import STOPPED_BY_TOOL
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.state import EngineStopResult
from graph_kvcache_mcp.connectors.processes.identity import is_ours
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from graph_kvcache_mcp.services.stack.views import EngineStatusOut
from tests.support.mcp_calls import MODES, call_error, call_ok


def _embedded(data_dir: Path, **extra: bool) -> Settings:
    return Settings.build(data_dir=data_dir, engine_backend="memory", **extra)


@contextmanager
def _cleanup(data_dir: Path) -> Iterator[ManagedEngine]:
    """Whatever a test leaves running in its data dir is stopped afterwards."""
    managed = ManagedEngine(data_dir)
    try:
        yield managed
    finally:
        managed.stop(term_wait_s=5.0)


@MODES
async def test_first_kv_use_starts_the_managed_engine_and_exit_stops_it(
    mode: str, tmp_path: Path
) -> None:
    with _cleanup(tmp_path) as managed:
        async with Client(build_server(_embedded(tmp_path)), mode=mode) as client:
            assert managed.running_state() is None  # nothing until a KV tool is used
            stats = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
            status = EngineStatusOut.model_validate(await call_ok(client, "engine_status", {}))
            running = managed.running_state()
        assert running is not None
        assert stats.reachable and stats.backend == "memory"
        assert stats.base_url == running.base_url == status.kv_base_url
        assert (status.started_by_this_server, status.stops_on_exit) == (True, True)
        assert status.kv_source == "managed"
        assert managed.running_state() is None and not is_ours(running.process)


async def test_start_engine_starts_it_at_startup_and_keep_engine_leaves_it_running(
    tmp_path: Path,
) -> None:
    with _cleanup(tmp_path) as managed:
        settings = _embedded(tmp_path, start_engine=True, keep_engine=True)
        async with Client(build_server(settings)) as client:
            started = managed.running_state()
            status = EngineStatusOut.model_validate(await call_ok(client, "engine_status", {}))
        assert started is not None
        assert status.started_by_this_server and not status.stops_on_exit
        assert is_ours(started.process)  # kept after the server exited


@MODES
async def test_an_engine_someone_else_started_is_reused_and_never_stopped_unforced(
    mode: str, tmp_path: Path
) -> None:
    with _cleanup(tmp_path) as managed:
        managed.start(backend="memory")  # as `graph-kvcache-mcp engine start` would
        theirs = managed.running_state()
        assert theirs is not None
        async with Client(build_server(_embedded(tmp_path)), mode=mode) as client:
            stats = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
            refused = await call_error(client, "engine_stop", {})
        assert stats.base_url == theirs.base_url
        assert "runs until `graph-kvcache-mcp engine stop`" in refused and "force=true" in refused
        assert is_ours(theirs.process)  # still running after our server exited
        async with Client(build_server(_embedded(tmp_path)), mode=mode) as client:
            forced = EngineStopResult.model_validate(
                await call_ok(client, "engine_stop", {"force": True})
            )
        assert forced.stopped and forced.pid == theirs.process.pid
        assert not is_ours(theirs.process)


@MODES
async def test_engine_stop_makes_kv_tools_unreachable_until_engine_start(
    mode: str, tmp_path: Path
) -> None:
    with _cleanup(tmp_path):
        async with Client(build_server(_embedded(tmp_path)), mode=mode) as client:
            await call_ok(client, "kv_stats", {})
            stopped = EngineStopResult.model_validate(await call_ok(client, "engine_stop", {}))
            down = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
            started = EngineStatusOut.model_validate(
                await call_ok(client, "engine_start", {"backend": "memory"})
            )
            up = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
        assert stopped.stopped and stopped.how in {"terminated", "killed"}
        assert (down.reachable, down.reason) == (False, STOPPED_BY_TOOL)
        assert started.running and started.reachable and started.started_by_this_server
        assert up.reachable and up.base_url == started.base_url


@MODES
async def test_a_configured_url_never_starts_or_stops_an_engine(mode: str, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    settings = Settings.build(kv_url=url, data_dir=tmp_path, start_engine=True)
    async with Client(build_server(settings), mode=mode) as client:
        stats = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
        start = await call_error(client, "engine_start", {})
        stop = await call_error(client, "engine_stop", {"force": True})
        status = EngineStatusOut.model_validate(await call_ok(client, "engine_status", {}))
    assert stats.reachable is False and stats.base_url == url
    assert "EPISTEMIC_GRAPH_KVCACHE_URL" in start and "EPISTEMIC_GRAPH_KVCACHE_URL" in stop
    assert (status.running, status.kv_source, status.kv_base_url) == (False, "configured", url)
    assert not (tmp_path / "engine" / "state.json").exists()


async def test_engine_stop_refuses_while_another_session_holds_a_lease(tmp_path: Path) -> None:
    with _cleanup(tmp_path) as managed:
        async with (
            Client(build_server(_embedded(tmp_path))) as first,
            Client(build_server(_embedded(tmp_path))) as second,
        ):
            await call_ok(first, "kv_stats", {})
            await call_ok(second, "kv_stats", {})
            refused = await call_error(first, "engine_stop", {})
            running = managed.running_state()
            forced = EngineStopResult.model_validate(
                await call_ok(first, "engine_stop", {"force": True})
            )
        assert "1 other server session(s)" in refused and "force=true" in refused
        assert running is not None and forced.stopped and forced.pid == running.process.pid


async def test_a_session_follows_an_engine_restarted_on_another_port(tmp_path: Path) -> None:
    with _cleanup(tmp_path) as managed:
        async with Client(build_server(_embedded(tmp_path))) as client:
            before = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
            managed.stop()  # as `graph-kvcache-mcp engine stop` then `engine start --port` would
            restarted = managed.start(backend="memory", port=free_port())
            after = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
            status = EngineStatusOut.model_validate(await call_ok(client, "engine_status", {}))
        assert before.reachable and after.reachable
        assert after.base_url == restarted.base_url != before.base_url
        assert status.pid == restarted.pid and not status.started_by_this_server
        still = managed.running_state()  # `engine start` engines outlive the sessions
        assert still is not None and still.process.pid == restarted.pid


@MODES
async def test_kv_stats_refuses_a_snapshot_of_another_backend(mode: str, tmp_path: Path) -> None:
    """An engine restarted on another backend: a delta across the two would mean nothing."""
    with _cleanup(tmp_path):
        async with Client(build_server(_embedded(tmp_path)), mode=mode) as client:
            memory = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
            await call_ok(client, "engine_stop", {})
            await call_ok(client, "engine_start", {"backend": "durable"})
            message = await call_error(client, "kv_stats", {"since": memory.snapshot_id})
    assert memory.backend == "memory"
    assert "`since` is a snapshot of a memory backend but this store is durable" in message
