"""Leases on the managed `lmcache server`, against a real one (from .venv-lmcache): the last
session out stops a server sessions started; a CLI-started one runs until `lmcache stop`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.files.private import write_private
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStopResult
from graph_kvcache_mcp.connectors.processes.identity import is_ours
from graph_kvcache_mcp.connectors.processes.leases import Lease
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.stack.runtime import managed_lmcache_hash_seed
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.stack.views import LmcacheStatusOut
from tests.support.engines import RunningEngine
from tests.support.lmcache import cpu_server_flags, require_lmcache
from tests.support.mcp_calls import call_error, call_ok

pytestmark = pytest.mark.lmcache

MODEL: dict[str, Any] = {"model": "test-model", "num_layers": 2, "kv_heads": 2, "head_dim": 64}


def _settings(engine: RunningEngine, data_dir: Path) -> Settings:
    return Settings.build(
        kv_url=engine.base_url,
        kv_token=engine.token,
        data_dir=data_dir,
        toolsets=("lmcache",),
        lmcache_python=require_lmcache().parent / "python",
    )


def _start_args(port: int, http_port: int) -> dict[str, Any]:
    return {
        **MODEL,
        "lmcache_port": port,
        "lmcache_http_port": http_port,
        "l1_size_gb": 0.1,
        "extra_args": cpu_server_flags(),
    }


def _stale_lease(managed: ManagedLmcache) -> Path:
    """A lease left by a session that was SIGKILLed: its pid now names another process."""
    ticks = -1  # no process ever started at that kernel time
    path = managed.leases.directory / f"{os.getpid()}-killed.json"
    write_private(
        path, Lease(pid=os.getpid(), start_ticks=ticks, taken_at=time.time()).model_dump_json()
    )
    return path


async def test_the_last_session_out_stops_the_server_sessions_started(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    """The first session starts it, the second reuses it; the first one out leaves it running,
    a third's unforced stop is refused while the second holds a lease, and the second one out
    stops it although a stale lease is left behind."""
    settings, managed = _settings(memory_engine, tmp_path), ManagedLmcache(tmp_path)
    args = _start_args(free_port(), free_port())
    try:
        async with Client(build_server(settings)) as second:
            async with Client(build_server(settings)) as first:
                started = LmcacheStatusOut.model_validate(
                    await call_ok(first, "lmcache_start", args)
                )
                reused = LmcacheStatusOut.model_validate(
                    await call_ok(second, "lmcache_start", args)
                )
            after_first = managed.status()
            assert started.http_url is not None
            seed = managed_lmcache_hash_seed(tmp_path, started.http_url)
            elsewhere = managed_lmcache_hash_seed(tmp_path, "http://127.0.0.1:1")
            async with Client(build_server(settings)) as third:
                await call_ok(third, "lmcache_start", args)
                refused = await call_error(third, "lmcache_stop", {})
                third_after = LmcacheStatusOut.model_validate(
                    await call_ok(third, "lmcache_status", {})
                )
            state = managed.running_state()
            stale = _stale_lease(managed)
        after_second = managed.status()
    finally:
        managed.stop()
    assert (started.reused, started.runs_until_stop, started.holds_lease) == (False, False, True)
    assert (reused.reused, reused.pid, len(reused.leases)) == (True, started.pid, 2)
    assert after_first.healthy and after_first.pid == started.pid
    assert len(after_first.leases) == 1  # the second session's
    # diagnose_stack compares it with vLLM's: read from our server's environment, no other's.
    assert (seed, elsewhere) == ("0", None)
    assert "1 other server session(s)" in refused and "force=true" in refused
    assert third_after.running and not third_after.holds_lease
    assert state is not None and state.process.pid == started.pid
    assert not after_second.running and not is_ours(state.process)
    assert not managed.state_file.path.exists() and not stale.exists()


async def test_a_cli_started_server_outlives_the_sessions_that_reuse_it_until_forced(
    memory_engine: RunningEngine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", memory_engine.base_url)
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    settings, managed = _settings(memory_engine, tmp_path), ManagedLmcache(tmp_path)
    port, http_port = free_port(), free_port()
    python = str(require_lmcache().parent / "python")
    common = ["--data-dir", str(tmp_path)]
    try:
        code = main(
            [
                "lmcache",
                "start",
                *("--model", "test-model", "--num-layers", "2", "--kv-heads", "2"),
                *("--head-dim", "64", "--l1-size-gb", "0.1", "--python", python),
                *("--lmcache-port", str(port), "--lmcache-http-port", str(http_port)),
                *(f"--extra-arg={flag}" for flag in cpu_server_flags()),
                *common,
            ]
        )
        capsys.readouterr()
        async with Client(build_server(settings)) as session:
            reused = LmcacheStatusOut.model_validate(
                await call_ok(session, "lmcache_start", _start_args(port, http_port))
            )
            status_code = main(["lmcache", "status", *common])
            listed = capsys.readouterr().out
        survived = managed.status()
        async with Client(build_server(settings)) as other:
            refused = await call_error(other, "lmcache_stop", {})
            forced = LmcacheStopResult.model_validate(
                await call_ok(other, "lmcache_stop", {"force": True})
            )
    finally:
        managed.stop()
    assert code == 0 and status_code == 0
    assert (reused.reused, reused.runs_until_stop, reused.holds_lease) == (True, True, True)
    assert f"runs until `lmcache stop`; sessions pid {os.getpid()}" in listed
    assert survived.healthy and survived.pid == reused.pid and survived.leases == []
    assert "runs until `graph-kvcache-mcp lmcache stop`" in refused and "force=true" in refused
    assert forced.stopped and forced.pid == reused.pid


async def test_lmcache_start_redis_resp_starts_the_managed_engine_with_its_wire_first(
    tmp_path: Path,
) -> None:
    """No engine runs: the tool starts the session's managed engine with its RESP wire, proves
    it, and the server's resp adapter stores into it; the session's exit stops both."""
    settings = Settings.build(
        data_dir=tmp_path,
        toolsets=("lmcache", "engine"),
        lmcache_python=require_lmcache().parent / "python",
    )
    args = {**_start_args(free_port(), free_port()), "mode": "redis_resp"}
    try:
        async with Client(build_server(settings)) as session:
            started = LmcacheStatusOut.model_validate(await call_ok(session, "lmcache_start", args))
            engine = await call_ok(session, "engine_status", {})
        assert started.healthy and started.holds_lease and started.resp_peer_gone is None
        assert started.report is not None and [a.healthy for a in started.report.l2_adapters] == [
            True
        ]
        assert engine["resp_address"] and engine["resp_address"].startswith("127.0.0.1:")
        assert ManagedLmcache(tmp_path).running_state() is None
    finally:
        ManagedLmcache(tmp_path).stop(term_wait_s=10.0)
        ManagedEngine(tmp_path).stop(term_wait_s=5.0)
