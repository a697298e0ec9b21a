"""Which process is which: identity of processes we started, their groups, and port listeners.

A process is ours only when the pid in our state file is alive **and** its kernel start time and
command line match what we recorded when we started it, so a recycled pid is never signalled.

Linux only: these answers come from /proc. Elsewhere every function here raises `ProcessError`
at once (see `require_linux`) instead of reporting "not running", which would make a stop
silently stop nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.errors import ProcessError

PROC = Path("/proc")


def require_linux() -> None:
    """Raise unless this machine has Linux's /proc, which every identity check here reads.

    Raises:
        ProcessError: names the platform and how to run without managed processes.
    """
    if not sys.platform.startswith("linux"):
        raise ProcessError(
            f"managed processes (the local engine, vLLM) need Linux: their identity checks "
            f"read /proc, and this is {sys.platform}. Start the engine or vLLM yourself and "
            "point the server at it with EPISTEMIC_GRAPH_KVCACHE_URL or VLLM_BASE_URL"
        )


class ProcessRecord(BaseModel):
    """What we write down about a process we started."""

    model_config = ConfigDict(frozen=True)

    pid: int
    start_ticks: int
    command: tuple[str, ...]
    started_at: float
    log_path: str


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None when it is gone."""
    require_linux()
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])


def is_alive(pid: int, ticks: int) -> bool:
    """True when `pid` runs and is the process that started at `ticks` (not a recycled pid)."""
    now = start_ticks(pid)
    return now is not None and now == ticks and not is_zombie(pid)


def is_ours(record: ProcessRecord) -> bool:
    """True when `record.pid` is still the very process we started (not a recycled pid)."""
    if not is_alive(record.pid, record.start_ticks):
        return False
    try:
        cmdline = (PROC / str(record.pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace") == record.command[0]


def is_zombie(pid: int) -> bool:
    require_linux()
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (Linux /proc)."""
    require_linux()
    members: list[int] = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in {"Z", "X"}:
            members.append(int(entry.name))
    return sorted(members)


def describe_listener(port: int) -> str:
    """'pid N (name)' of whatever listens on `port`, best effort from /proc."""
    pid = listener_pid(port)
    if pid is None:
        return "owner unknown"
    try:
        name = (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        name = "?"
    return f"pid {pid} ({name})"


def listener_pid(port: int) -> int | None:
    """The pid holding a listening TCP socket on `port`, when /proc lets us see it."""
    require_linux()
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(entry.name)
        except OSError:
            continue
    return None
