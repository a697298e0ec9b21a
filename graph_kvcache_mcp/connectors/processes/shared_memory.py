"""The shared-memory segments a process group maps, and removing the ones it left behind.

vLLM's engine core and workers talk over `multiprocessing.shared_memory` queues
(`/dev/shm/psm_*`, 160–240 MiB each on CPU, with `sem.mp-*` semaphores). A worker that dies
before its own cleanup (a failed start, a crash, SIGKILL after a stop's grace) leaves them
behind, and nothing else ever frees that memory. A segment is ours to remove only when a
process we started mapped it, it is a regular file of our user, and no live process maps it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import remove_own
from graph_kvcache_mcp.connectors.processes.identity import group_members

SHM_DIR = Path("/dev/shm")
_PREFIX = f"{SHM_DIR}/"
_MAX_MAPS_BYTES = 8 * 1024 * 1024
"""A bound on one process's maps (a CPU vLLM worker's is about 1 MiB)."""


def mapped_segments(pids: Iterable[int]) -> set[str]:
    """Names under /dev/shm that these processes map now (gone or unreadable ones skipped)."""
    names: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as maps:
                text = maps.read(_MAX_MAPS_BYTES).decode(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(_PREFIX):
                name = fields[5][len(_PREFIX) :]
                if "/" not in name and not name.endswith(" (deleted)"):
                    names.add(name)
    return names


def group_segments(pgid: int) -> set[str]:
    """Names under /dev/shm that the live members of process group `pgid` map now."""
    return mapped_segments(group_members(pgid))


class SegmentWatch:
    """What a starting process group maps, sampled while we wait for it (its segments are
    gone from /proc once it dies, so a failed start is cleaned from what was seen)."""

    def __init__(self, pgid: int, *, every_s: float = 2.0) -> None:
        self.pgid = pgid
        self.every_s = every_s
        self.seen: set[str] = set()
        self._next = 0.0

    def sample(self, *, now: bool = False) -> set[str]:
        """Add what the group maps (at most every `every_s` unless `now`); all seen so far."""
        moment = time.monotonic()
        if now or moment >= self._next:
            self.seen |= group_segments(self.pgid)
            self._next = moment + self.every_s
        return self.seen


def remove_unmapped(names: Iterable[str]) -> list[str]:
    """Remove those of `names` that no live process maps and that are regular files of ours
    (never through a link); the names removed."""
    wanted = {name for name in names if name and "/" not in name}
    if not wanted:
        return []
    live = mapped_segments(int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return [name for name in sorted(wanted - live) if remove_own(SHM_DIR / name)]
