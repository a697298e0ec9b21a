"""The shared memory a process group we started leaves behind, staged with real processes:
a child that creates a `multiprocessing.shared_memory` segment or a spawn context's lock (a
`sem.mp-*` semaphore), as vLLM's workers do, and is killed before it can clean up."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from graph_kvcache_mcp.connectors.processes.shared_memory import (
    SHM_DIR,
    SegmentWatch,
    remove_unmapped,
)

_HOLDER = """
import sys, time
from multiprocessing import resource_tracker, shared_memory
segment = shared_memory.SharedMemory(create=True, size=4096)
resource_tracker.unregister(segment._name, "shared_memory")  # a killed worker's: no tracker
print(segment.name, flush=True)
time.sleep(120)
"""


_SEMAPHORE_HOLDER = """
import multiprocessing, time
lock = multiprocessing.get_context("spawn").Lock()  # a named semaphore, as vLLM's spawn uses
print("sem." + lock._semlock.name.lstrip("/"), flush=True)
time.sleep(120)
"""


def _holder(script: str = _HOLDER) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert child.stdout is not None
    return child, child.stdout.readline().strip().lstrip("/")


def _kill(child: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group may be gone already
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=30)


def test_a_killed_groups_segment_is_removed_and_a_mapped_one_is_kept() -> None:
    dead, dead_name = _holder()
    alive, alive_name = _holder()
    try:
        watch = SegmentWatch(dead.pid)
        assert dead_name in watch.sample(now=True)
        assert alive_name not in watch.seen  # another group's segment is not ours
        _kill(dead)
        assert (SHM_DIR / dead_name).exists()  # what a SIGKILL leaves behind
        removed = remove_unmapped({*watch.seen, alive_name})
        assert removed == [dead_name]
        assert not (SHM_DIR / dead_name).exists()
        assert (SHM_DIR / alive_name).exists()  # still mapped by a live process: kept
    finally:
        _kill(alive)
        Path(SHM_DIR / alive_name).unlink(missing_ok=True)
        Path(SHM_DIR / dead_name).unlink(missing_ok=True)


def test_a_segment_name_never_leads_out_of_dev_shm(tmp_path: Path) -> None:
    outside = tmp_path / "kept"
    outside.write_text("not shared memory")
    assert remove_unmapped({f"../..{outside}", str(outside), ""}) == []
    assert outside.exists()


def test_a_killed_groups_semaphore_is_removed_though_its_maps_show_it_deleted() -> None:
    dead, name = _holder(_SEMAPHORE_HOLDER)
    try:
        assert name.startswith("sem.mp-") and (SHM_DIR / name).exists()
        watch = SegmentWatch(dead.pid)
        assert name in watch.sample(now=True)
        _kill(dead)  # the group: the holder and its resource tracker
        assert (SHM_DIR / name).exists()  # what a SIGKILL leaves behind
        assert remove_unmapped(watch.seen) == [name]
        assert not (SHM_DIR / name).exists()
    finally:
        _kill(dead)
        Path(SHM_DIR / name).unlink(missing_ok=True)
