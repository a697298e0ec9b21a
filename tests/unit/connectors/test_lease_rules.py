"""The lease rules: who stops a leased process, and when a session's own stop is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.files.private import write_private
from graph_kvcache_mcp.connectors.processes.identity import ProcessRecord
from graph_kvcache_mcp.connectors.processes.lease_rules import (
    LeasedState,
    SessionLease,
    keep_until_stop,
    release_lease,
    stop_refusal,
)
from graph_kvcache_mcp.connectors.processes.leases import Lease, Leases
from graph_kvcache_mcp.connectors.processes.state_file import StateFile


def _state(*, runs_until_stop: bool) -> LeasedState:
    record = ProcessRecord(
        pid=4242, start_ticks=1, command=("server",), started_at=0.0, log_path="log"
    )
    return LeasedState(process=record, runs_until_stop=runs_until_stop)


def _release(
    leases: Leases, lease: Path, state: LeasedState | None, *, stop_if_last: bool = True
) -> str | None:
    return release_lease(
        leases, lease, stop_if_last=stop_if_last, running=lambda: state, stop=lambda: "stopped"
    )


@pytest.mark.parametrize(
    ("runs_until_stop", "stop_if_last", "expected"),
    [(False, True, "stopped"), (True, True, None), (False, False, None)],
)
def test_the_last_lease_out_stops_only_a_session_started_process_when_allowed(
    tmp_path: Path, runs_until_stop: bool, stop_if_last: bool, expected: str | None
) -> None:
    leases = Leases(tmp_path)
    mine = leases.take()
    state = _state(runs_until_stop=runs_until_stop)
    assert _release(leases, mine, state, stop_if_last=stop_if_last) == expected
    assert leases.live() == {}


def test_a_release_while_another_lease_lives_stops_nothing(tmp_path: Path) -> None:
    leases = Leases(tmp_path)
    mine, theirs = leases.take(), leases.take()
    assert _release(leases, mine, _state(runs_until_stop=False)) is None
    assert list(leases.live()) == [theirs]


def test_a_stale_lease_does_not_keep_the_process_running(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    leases = Leases(tmp_path)
    mine = leases.take()
    stale = tmp_path / f"{dead.pid}-stale.json"
    write_private(stale, Lease(pid=dead.pid, start_ticks=1, taken_at=time.time()).model_dump_json())
    assert _release(leases, mine, _state(runs_until_stop=False)) == "stopped"
    assert not stale.exists()


def test_nothing_running_means_nothing_to_stop(tmp_path: Path) -> None:
    leases = Leases(tmp_path)
    assert _release(leases, leases.take(), None) is None


def test_keep_until_stop_records_a_cli_claim_on_a_session_started_process(tmp_path: Path) -> None:
    state_file = StateFile(tmp_path / "state.json", LeasedState)
    started = _state(runs_until_stop=False)
    state_file.write(started)
    kept = keep_until_stop(state_file, started)
    assert kept.runs_until_stop and state_file.read() == kept


def test_stop_refusal_names_the_cli_start_or_the_other_sessions() -> None:
    cli = stop_refusal(
        _state(runs_until_stop=True), [], what="the server", stop_command="tool stop"
    )
    others = stop_refusal(
        _state(runs_until_stop=False), [11, 12], what="the server", stop_command="tool stop"
    )
    assert cli is not None and "runs until `tool stop`" in cli and "force=true" in cli
    assert others is not None and "2 other server session(s) (pid 11, 12)" in others
    assert stop_refusal(_state(runs_until_stop=False), [], what="x", stop_command="y") is None


class _Manager:
    """A manager with real lease files whose release records what it was asked."""

    def __init__(self, directory: Path) -> None:
        self.leases = Leases(directory)
        self.released: list[tuple[Path, bool]] = []

    def release(self, lease: Path, *, stop_if_last: bool) -> str | None:
        self.leases.drop(lease)
        self.released.append((lease, stop_if_last))
        return None


async def test_a_session_holds_one_lease_and_counts_only_the_others(tmp_path: Path) -> None:
    manager = _Manager(tmp_path)
    session = SessionLease(manager)
    theirs = manager.leases.take()
    assert await session.take() is True and await session.take() is False
    assert session.held and len(manager.leases.live()) == 2
    assert await session.others() == [os.getpid()]  # theirs, in this same test process
    mine = session.path
    await session.release(stop_if_last=True)
    await session.release(stop_if_last=True)  # a second release has nothing to drop
    assert manager.released == [(mine, True)] and not session.held
    assert list(manager.leases.live()) == [theirs]
