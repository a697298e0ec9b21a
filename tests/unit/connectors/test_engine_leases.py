"""Lease files: live while their process runs; a dead or recycled pid makes them stale."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import write_private
from graph_kvcache_mcp.connectors.processes.identity import start_ticks
from graph_kvcache_mcp.connectors.processes.leases import Lease, Leases


def _lease_of(directory: Path, pid: int, ticks: int) -> Path:
    path = directory / f"{pid}-test.json"
    write_private(path, Lease(pid=pid, start_ticks=ticks, taken_at=time.time()).model_dump_json())
    return path


def test_a_taken_lease_is_live_until_dropped(tmp_path: Path) -> None:
    leases = Leases(tmp_path / "leases")
    path = leases.take()
    live = leases.live()
    assert list(live) == [path] and live[path].pid == os.getpid()
    leases.drop(path)
    assert leases.live() == {}


def test_a_lease_of_a_dead_process_is_stale_and_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = start_ticks(dead.pid)
    dead.wait()
    leases = Leases(tmp_path)
    stale = _lease_of(tmp_path, dead.pid, ticks if ticks is not None else 0)
    assert leases.live() == {} and not stale.exists()


def test_a_lease_whose_pid_was_recycled_is_stale(tmp_path: Path) -> None:
    ticks = start_ticks(os.getpid())
    assert ticks is not None
    recycled = _lease_of(tmp_path, os.getpid(), ticks + 1)  # same pid, another process's start
    assert Leases(tmp_path).live() == {} and not recycled.exists()


def test_looking_without_tidy_leaves_stale_leases_alone(tmp_path: Path) -> None:
    stale = _lease_of(tmp_path, os.getpid(), -5)
    assert Leases(tmp_path).live(tidy=False) == {} and stale.exists()


def test_garbage_in_the_lease_dir_counts_as_no_lease(tmp_path: Path) -> None:
    write_private(tmp_path / "junk.json", "not json")
    assert Leases(tmp_path).live() == {}


def test_taking_a_lease_clears_the_stale_ones(tmp_path: Path) -> None:
    stale = _lease_of(tmp_path, os.getpid(), -5)
    leases = Leases(tmp_path)
    mine = leases.take()
    assert not stale.exists() and list(leases.live()) == [mine]
