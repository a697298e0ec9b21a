"""The shared-memory segments a process group maps, and removing the ones it left behind.

vLLM's engine core and workers talk over `multiprocessing.shared_memory` queues
(`/dev/shm/psm_*`, 160–240 MiB each on CPU, with `sem.mp-*` semaphores). A worker that dies
before its own cleanup (a failed start, a crash, SIGKILL after a stop's grace) leaves them
behind, and nothing else ever frees that memory. A segment is ours to remove only when a
process we started mapped it, it is a regular file of our user, and no live process maps it.

A POSIX semaphore does not show its name in the maps of the process that created it: glibc's
`sem_open` writes a temporary `sem.XXXXXX`, maps it, links it to `sem.<name>` and unlinks the
temporary name, so the mapping reads `/dev/shm/sem.XXXXXX (deleted)`. The file is the same one,
so such a mapping is tied to its name by device and inode: the `sem.*` file in the directory
with that identity is the one the process maps (docs/security.md, "The processes we start").
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import remove_own
from graph_kvcache_mcp.connectors.processes.identity import group_members

SHM_DIR = Path("/dev/shm")
SEMAPHORE_PREFIX = "sem."
"""glibc's names for POSIX semaphores in SHM_DIR (`sem.mp-*` are multiprocessing's)."""
_DELETED = " (deleted)"
_MAX_MAPS_BYTES = 8 * 1024 * 1024
"""A bound on one process's maps (a CPU vLLM worker's is about 1 MiB)."""

FileIdentity = tuple[int, int, int]
"""A file's device (major, minor) and inode, as /proc/PID/maps shows them."""


def mapped_segments(pids: Iterable[int], shm_dir: Path = SHM_DIR) -> set[str]:
    """Names in `shm_dir` that these processes map now (gone or unreadable ones skipped),
    semaphores among them under the names they were linked to."""
    prefix = f"{shm_dir}/"
    names: set[str] = set()
    unlinked: set[FileIdentity] = set()
    for pid in pids:
        for fields in _shm_mappings(pid, prefix):
            name = fields[5][len(prefix) :]
            if "/" in name:
                continue
            if not name.endswith(_DELETED):
                names.add(name)
            elif name.startswith(SEMAPHORE_PREFIX) and (identity := _identity(fields)):
                unlinked.add(identity)
    return names | semaphores_linked(unlinked, shm_dir)


def semaphores_linked(identities: set[FileIdentity], shm_dir: Path = SHM_DIR) -> set[str]:
    """The `sem.*` names in `shm_dir` of the regular files with these identities."""
    if not identities:
        return set()
    try:
        entries = [e for e in os.scandir(shm_dir) if e.name.startswith(SEMAPHORE_PREFIX)]
    except OSError:
        return set()
    found: set[str] = set()
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        identity = (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)
        if stat.S_ISREG(info.st_mode) and identity in identities:
            found.add(entry.name)
    return found


def _shm_mappings(pid: int, prefix: str) -> list[list[str]]:
    """The fields of `pid`'s mappings of files under `prefix` (none when it is gone or its maps
    cannot be read)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            text = maps.read(_MAX_MAPS_BYTES).decode(errors="replace")
    except OSError:
        return []
    rows = (line.split(maxsplit=5) for line in text.splitlines())
    return [fields for fields in rows if len(fields) == 6 and fields[5].startswith(prefix)]


def _identity(fields: list[str]) -> FileIdentity | None:
    """The device and inode of one maps line (`major:minor` in hex, inode in decimal)."""
    major, _, minor = fields[3].partition(":")
    try:
        return int(major, 16), int(minor, 16), int(fields[4])
    except ValueError:
        return None


def group_segments(pgid: int, shm_dir: Path = SHM_DIR) -> set[str]:
    """Names in `shm_dir` that the live members of process group `pgid` map now."""
    return mapped_segments(group_members(pgid), shm_dir)


class SegmentWatch:
    """What a starting process group maps, sampled while we wait for it (its segments are
    gone from /proc once it dies, so a failed start is cleaned from what was seen)."""

    def __init__(self, pgid: int, *, every_s: float = 2.0, shm_dir: Path = SHM_DIR) -> None:
        self.pgid = pgid
        self.every_s = every_s
        self.shm_dir = shm_dir
        self.seen: set[str] = set()
        self._next = 0.0

    def sample(self, *, now: bool = False) -> set[str]:
        """Add what the group maps (at most every `every_s` unless `now`); all seen so far."""
        moment = time.monotonic()
        if now or moment >= self._next:
            self.seen |= group_segments(self.pgid, self.shm_dir)
            self._next = moment + self.every_s
        return self.seen


def remove_unmapped(names: Iterable[str], shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove those of `names` in `shm_dir` that no live process maps (a semaphore too, under
    its linked name) and that are regular files of ours (never through a link); the names
    removed."""
    wanted = {name for name in names if name and "/" not in name}
    if not wanted:
        return []
    pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    live = mapped_segments(pids, shm_dir)
    return [name for name in sorted(wanted - live) if remove_own(shm_dir / name)]
