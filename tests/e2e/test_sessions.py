"""Several stdio sessions on one data dir, as several agent windows run them: leases decide who
stops the engine, stale leases are cleared, an orphaned engine is adopted, a dead one restarts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcp import Client, StdioServerParameters

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.state import EngineStatus
from graph_kvcache_mcp.services.kv.views import KvGetManyOut, KvPutOut
from graph_kvcache_mcp.services.stack.views import EngineStatusOut
from tests.support.mcp_calls import b64, call_ok, fresh_key
from tests.support.processes import (
    clean_env,
    engine_gone,
    engine_session,
    running_engine_state,
    venv_script,
    wait_until,
)


def _session(data_dir: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(venv_script("graph-kvcache-mcp")), args=["--data-dir", str(data_dir)]
    )


@contextmanager
def _stopped_afterwards(data_dir: Path) -> Iterator[ManagedEngine]:
    managed = ManagedEngine(data_dir)
    try:
        yield managed
    finally:
        managed.stop(term_wait_s=5.0)


async def _status(client: Client) -> EngineStatusOut:
    return EngineStatusOut.model_validate(await call_ok(client, "engine_status", {}))


async def _get(client: Client, key: str) -> KvGetManyOut:
    return KvGetManyOut.model_validate(await call_ok(client, "kv_get", {"keys": [key]}))


async def test_a_session_that_exits_leaves_the_engine_to_the_other_and_the_last_stops_it(
    tmp_path: Path,
) -> None:
    key = fresh_key("sessions")
    with _stopped_afterwards(tmp_path):
        async with Client(_session(tmp_path)) as b:
            await call_ok(b, "kv_stats", {})  # B uses the engine first: it starts it
            async with Client(_session(tmp_path)) as a:
                put = KvPutOut.model_validate(
                    await call_ok(a, "kv_put", {"key": key, "value_b64": b64(b"shared")})
                )
                both = await _status(a)
            state = running_engine_state(tmp_path)
            after_a = await _get(b, key)
            only_b = await _status(b)
        assert put.reachable and len(both.leases) == 2
        assert both.started_by_this_server is False and both.stops_on_exit
        assert state is not None and state.process.pid == both.pid  # A's exit left it running
        assert after_a.hits == 1
        assert len(only_b.leases) == 1
        assert {lease.pid for lease in only_b.leases} < {lease.pid for lease in both.leases}
        wait_until(lambda: engine_gone(state), timeout_s=15, what="the last session to stop it")


def _kill_a_session_that_started_the_engine(data_dir: Path) -> int:
    """Run a stdio session that starts the engine, SIGKILL it; returns its pid."""
    with engine_session(data_dir) as victim:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    return victim.pid


def _cli_engine_status(data_dir: Path) -> EngineStatus:
    done = subprocess.run(
        [
            str(venv_script("graph-kvcache-mcp")),
            "engine",
            "status",
            "--json",
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    return EngineStatus.model_validate(json.loads(done.stdout))


async def test_a_killed_session_leaves_a_stale_lease_and_its_engine_is_adopted(
    tmp_path: Path,
) -> None:
    with _stopped_afterwards(tmp_path):
        victim = _kill_a_session_that_started_the_engine(tmp_path)
        orphan = running_engine_state(tmp_path)
        lease_files = list((tmp_path / "engine" / "leases").glob("*.json"))
        seen_by_cli = _cli_engine_status(tmp_path)
        async with Client(_session(tmp_path)) as client:
            await call_ok(client, "kv_stats", {})
            adopted = await _status(client)
        assert orphan is not None and len(lease_files) == 1
        assert lease_files[0].name.startswith(f"{victim}-")
        assert seen_by_cli.running and seen_by_cli.leases == []  # the dead session's lease ...
        assert not lease_files[0].exists()  # ... was removed by `engine status`
        assert adopted.pid == orphan.process.pid and not adopted.started_by_this_server
        assert victim not in [lease.pid for lease in adopted.leases]
        assert adopted.holds_lease and adopted.stops_on_exit
        wait_until(lambda: engine_gone(orphan), timeout_s=15, what="the adopter to stop it")


async def test_a_killed_engine_is_started_again_by_the_next_kv_call(tmp_path: Path) -> None:
    key = fresh_key("heal")
    with _stopped_afterwards(tmp_path):
        async with Client(_session(tmp_path)) as client:
            await call_ok(client, "kv_put", {"key": key, "value_b64": b64(b"durable bytes")})
            first = running_engine_state(tmp_path)
            assert first is not None
            os.kill(first.process.pid, signal.SIGKILL)
            wait_until(lambda: engine_gone(first), timeout_s=10, what="the engine to die")
            healed = await _get(client, key)
            status = await _status(client)
            second = running_engine_state(tmp_path)
        assert healed.reachable and healed.hits == 1  # the same durable store, read again
        assert status.running and status.pid != first.process.pid
        assert status.started_by_this_server and status.holds_lease
        assert second is not None and second.process.pid == status.pid
        wait_until(lambda: engine_gone(second), timeout_s=15, what="the session to stop it")


def _tree(root: Path, *, skip: tuple[str, ...] = ()) -> list[str]:
    names = (str(path.relative_to(root)) for path in root.rglob("*"))
    return sorted(name for name in names if not name.startswith(skip))


async def test_read_only_on_a_fresh_data_dir_creates_nothing_and_says_how_to_start(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "fresh"
    before = _tree(tmp_path)
    server = StdioServerParameters(
        command=str(venv_script("graph-kvcache-mcp")),
        args=["--read-only", "--data-dir", str(data_dir)],
        env={"HOME": str(tmp_path), "GRAPH_KVCACHE_TOOLSETS": "kv,engine,vllm,bundle"},
    )
    async with Client(server) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        got = await _get(client, fresh_key("ro"))
        for tool in sorted(names & {"kv_stats", "kv_probe", "engine_status", "vllm_status"}):
            await call_ok(client, tool, {})
    assert not got.reachable and got.reason is not None
    assert got.reason.startswith(f"read-only: no engine runs for {data_dir}")
    assert "engine_start" in got.reason and "graph-kvcache-mcp engine start" in got.reason
    assert _tree(tmp_path) == before


async def test_read_only_uses_an_engine_that_runs_without_taking_a_lease(tmp_path: Path) -> None:
    key = fresh_key("ro")
    with _stopped_afterwards(tmp_path) as managed:
        managed.start(backend="memory")
        state = managed.running_state()
        assert state is not None
        with managed.client(state) as writer:
            writer.put(key, b"seen read-only")
        engines_own = ("engine/store", "engine/engine.sock")  # what the engine itself writes
        before = _tree(tmp_path, skip=engines_own)
        server = StdioServerParameters(
            command=str(venv_script("graph-kvcache-mcp")),
            args=["--read-only", "--data-dir", str(tmp_path)],
        )
        async with Client(server) as client:
            got = await _get(client, key)
            status = await _status(client)
        assert got.hits == 1 and status.running and not status.holds_lease
        assert status.leases == [] and _tree(tmp_path, skip=engines_own) == before
