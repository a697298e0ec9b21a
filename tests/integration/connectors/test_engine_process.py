"""The managed engine: start, reuse, status, stop, and the errors a user can act on."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.state import EngineState
from graph_kvcache_mcp.connectors.processes.identity import ProcessRecord, start_ticks
from graph_kvcache_mcp.errors import EngineProcessError
from tests.support.engines import RunningEngine
from tests.support.processes import wait_until


def test_start_writes_private_secrets_and_a_state_file(memory_engine: RunningEngine) -> None:
    home = memory_engine.managed.home
    for name in ("token", "auth_secret", "signer_key", "state.json"):
        mode = stat.S_IMODE((home / name).stat().st_mode)
        assert mode == 0o600, name
    state_text = (home / "state.json").read_text()
    assert memory_engine.token.get_secret_value() not in state_text


def test_status_reports_pid_port_backend_and_uptime(memory_engine: RunningEngine) -> None:
    status = memory_engine.managed.status()
    assert status.running and status.reachable and status.managed_by_us
    assert status.backend == "memory"
    assert status.base_url == memory_engine.base_url
    assert status.uptime_s is not None and status.uptime_s >= 0


def test_start_again_reuses_the_running_engine(memory_engine: RunningEngine) -> None:
    before = memory_engine.managed.status()
    again = memory_engine.managed.start(backend="memory")
    assert again.reused and again.pid == before.pid


def test_stop_terminates_and_status_then_says_not_running(tmp_path: Path) -> None:
    managed = ManagedEngine(tmp_path)
    started = managed.start(backend="memory")
    result = managed.stop()
    assert result.stopped and result.how == "terminated" and result.pid == started.pid
    assert start_ticks(started.pid or -1) is None
    assert not managed.status().running
    assert managed.stop().how == "not_running"


def test_a_port_in_use_is_a_clear_error(tmp_path: Path, memory_engine: RunningEngine) -> None:
    state = memory_engine.managed.running_state()
    assert state is not None
    with pytest.raises(EngineProcessError, match=f"port {state.port} .* already in use"):
        ManagedEngine(tmp_path).start(port=state.port)


def test_a_data_dir_locked_by_another_engine_is_reported_with_its_reason(tmp_path: Path) -> None:
    first = ManagedEngine(tmp_path)
    first.start(backend="memory")
    record = first.state()
    assert record is not None
    try:
        first.state_path.unlink()  # forget it: a second start must meet the engine's own lock
        with pytest.raises(EngineProcessError, match="lock") as refused:
            ManagedEngine(tmp_path).start(backend="memory", ready_timeout_s=15)
        # The engine colours its log; the reason quoting it is plain text.
        assert "\x1b" in (tmp_path / "engine" / "engine.log").read_text()
        assert str(refused.value).isprintable()
    finally:
        first.state_path.write_text(record.model_dump_json())
        first.stop()


def test_stop_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        managed = ManagedEngine(tmp_path)
        # A state file naming the stranger's pid, as if recycled: the start time will not match.
        fake = ProcessRecord(
            pid=stranger.pid,
            start_ticks=(start_ticks(stranger.pid) or 0) + 1,
            command=(sys.executable,),
            started_at=time.time(),
            log_path=str(tmp_path / "x.log"),
        )
        managed.home.mkdir(parents=True)
        recycled = EngineState(
            process=fake,
            port=1,
            backend="memory",
            base_url="http://127.0.0.1:1",
            data_dir=str(tmp_path),
        )
        managed.state_path.write_text(recycled.model_dump_json())
        assert managed.stop().how == "not_running"
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_concurrent_starts_share_one_engine(tmp_path: Path) -> None:
    """Two starts racing on one data dir: one engine runs, the other caller reuses it."""
    from concurrent.futures import ThreadPoolExecutor

    managed = [ManagedEngine(tmp_path), ManagedEngine(tmp_path)]
    try:
        with ThreadPoolExecutor(2) as pool:
            statuses = list(pool.map(lambda m: m.start(backend="memory"), managed))
        assert statuses[0].pid == statuses[1].pid
        assert sorted(s.reused for s in statuses) == [False, True]
        assert managed[0].status().reachable
    finally:
        managed[0].stop()
    assert not managed[1].status().running


def test_stop_removes_the_engine_s_unix_socket(tmp_path: Path) -> None:
    managed = ManagedEngine(tmp_path)
    managed.start(backend="durable")
    socket = managed.socket_path
    try:
        wait_until(socket.is_socket, timeout_s=30, what="the engine to make its socket")
    finally:
        managed.stop()
    assert not socket.exists()
