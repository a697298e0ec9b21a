"""Semaphores a killed process group leaves behind, with real files and real mappings in a tmp
dir standing in for /dev/shm: a child makes a semaphore file the way glibc's `sem_open` does
(a temporary `sem.XXXXXX`, mapped, linked to `sem.mp-*`, the temporary name unlinked), so its
maps show only the deleted temporary name; the cleanup ties the mapping to the linked name by
device and inode, and removes the file once no live process maps it, only when it is ours."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.processes.shared_memory import (
    SegmentWatch,
    group_segments,
    remove_unmapped,
)

# What glibc's sem_open(O_CREAT) does in the shm dir, in a process that then waits to be killed.
_SEMAPHORE_HOLDER = """
import mmap, os, sys, tempfile, time
shm_dir, name = sys.argv[1:]
fd, temporary = tempfile.mkstemp(prefix="sem.", dir=shm_dir)
os.write(fd, bytes(32))
mapping = mmap.mmap(fd, 32)
os.link(temporary, os.path.join(shm_dir, name))
os.unlink(temporary)
os.close(fd)
print("ready", flush=True)
time.sleep(120)
"""


class Holders:
    """The semaphore holders a test starts, each in a process group of its own; all killed at
    the end."""

    def __init__(self, shm_dir: Path) -> None:
        self.shm_dir = shm_dir
        self.children: list[subprocess.Popen[str]] = []

    def start(self, name: str) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", _SEMAPHORE_HOLDER, str(self.shm_dir), name],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.children.append(child)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return child

    def kill(self, child: subprocess.Popen[str]) -> None:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[Holders]:
    made = Holders(tmp_path / "shm")
    made.shm_dir.mkdir()
    yield made
    for child in made.children:
        made.kill(child)


def test_a_semaphore_is_seen_under_its_linked_name_though_the_maps_show_it_deleted(
    holders: Holders,
) -> None:
    child = holders.start("sem.mp-held")
    maps = Path(f"/proc/{child.pid}/maps").read_text()
    shown = [line for line in maps.splitlines() if str(holders.shm_dir) in line]
    assert len(shown) == 1 and shown[0].endswith(" (deleted)") and "sem.mp-held" not in shown[0]
    assert group_segments(child.pid, holders.shm_dir) == {"sem.mp-held"}


def test_a_killed_groups_semaphore_is_removed_and_a_live_ones_is_kept(holders: Holders) -> None:
    dead = holders.start("sem.mp-dead")
    holders.start("sem.mp-alive")
    watch = SegmentWatch(dead.pid, shm_dir=holders.shm_dir)
    assert watch.sample(now=True) == {"sem.mp-dead"}  # the other group's is not ours
    holders.kill(dead)
    assert (holders.shm_dir / "sem.mp-dead").exists()  # what a SIGKILL leaves behind
    removed = remove_unmapped({*watch.seen, "sem.mp-alive"}, holders.shm_dir)
    assert removed == ["sem.mp-dead"]
    assert not (holders.shm_dir / "sem.mp-dead").exists()
    assert (holders.shm_dir / "sem.mp-alive").exists()  # still mapped by a live process


def test_a_semaphore_of_another_user_is_never_removed(holders: Holders) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing a file to another user needs root")
    dead = holders.start("sem.mp-theirs")
    seen = group_segments(dead.pid, holders.shm_dir)
    holders.kill(dead)
    os.chown(holders.shm_dir / "sem.mp-theirs", 65534, 65534)
    assert seen == {"sem.mp-theirs"}
    assert remove_unmapped(seen, holders.shm_dir) == []
    assert (holders.shm_dir / "sem.mp-theirs").exists()


def test_a_link_named_like_a_semaphore_is_not_followed(holders: Holders, tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.write_bytes(bytes(32))
    (holders.shm_dir / "sem.mp-link").symlink_to(kept)
    assert remove_unmapped({"sem.mp-link"}, holders.shm_dir) == []
    assert kept.exists()
