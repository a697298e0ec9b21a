"""Which process is which: identity of processes we started, their groups, and port listeners.

A process is ours only when the pid in our state file is alive **and** its kernel start time and
command line match what we recorded when we started it, so a recycled pid is never signalled. Those
facts are world-readable in /proc, so a record must also match by two that are not: the process
runs as our user, and its environment (readable only by its owner) holds the nonce we gave it at
spawn. A forged record that copies a real pid, start time and argv[0] names a process that fails one
of the two.

A port's listener is ours only when every listening socket on that port is an open file of our
process (`listener_owner`): a token is sent to a port only after that check, so a squatter that
bound the port first never receives one.

Linux only: these answers come from /proc. Elsewhere every function here raises `ProcessError`
at once (see `require_linux`) instead of reporting "not running", which would make a stop
silently stop nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.errors import ProcessError

PROC = Path("/proc")
NONCE_VARIABLE = "GRAPH_KVCACHE_PROCESS_NONCE"
"""Set in the environment of every child we spawn; the state record holds the same value."""
ListenerOwner: TypeAlias = Literal["ours", "none", "foreign"]


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
    nonce: str | None = None
    """The value of `NONCE_VARIABLE` in the child's environment. A record without one (written
    by an older version, or forged) matches no process."""


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
    """True when `record.pid` is still the very process we started: not a recycled pid, and not
    another user's process dressed up with the same pid, start time and argv[0]."""
    if not is_alive(record.pid, record.start_ticks):
        return False
    proc = PROC / str(record.pid)
    try:
        if proc.stat().st_uid != os.getuid():
            return False
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not cmdline or cmdline[0].decode(errors="replace") != record.command[0]:
        return False
    return (
        record.nonce is not None and environment_value(record.pid, NONCE_VARIABLE) == record.nonce
    )


def environment_value(pid: int, name: str) -> str | None:
    """One variable of the environment `pid` started with (Linux /proc; readable only for our
    own processes); None when unset or unreadable. Only `name` is kept: the rest (keys, tokens)
    is never returned."""
    try:
        block = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in block.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


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


def listener_owner(pid: int, port: int, *, group: bool = False) -> ListenerOwner:
    """Who listens on TCP `port` (any address, IPv4 or IPv6): "ours" when every listening socket
    there is an open file of `pid` (or, with `group`, of a member of the process group `pid`
    leads), "none" when nothing listens, else "foreign"."""
    wanted = _listening_sockets(port)
    if not wanted:
        return "none"
    held = socket_links(pid)
    if group and not wanted <= held:
        for member in group_members(pid):
            held |= socket_links(member)
    return "ours" if wanted <= held else "foreign"


def socket_links(pid: int) -> set[str]:
    """The `socket:[inode]` links among the open files of `pid` (empty when unreadable)."""
    links: set[str] = set()
    try:
        for fd in (PROC / str(pid) / "fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                links.add(target)
    except OSError:
        pass
    return links


def _listening_sockets(port: int) -> set[str]:
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
    return {f"socket:[{inode}]" for inode in inodes}


def listener_pid(port: int) -> int | None:
    """The pid holding a listening TCP socket on `port`, when /proc lets us see it."""
    wanted = _listening_sockets(port)
    if not wanted:
        return None
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
