"""Which process is which: identity of processes we started, their groups, and port listeners.

A process is ours only when the pid in our state file is alive **and** its kernel start time and
command line match what we recorded when we started it, so a recycled pid is never signalled. Those
facts are public (any user can read them), so a record must also match by two that are not: the
process runs as our user, and its environment (readable only by its owner) holds the nonce we gave
it at spawn. A forged record that copies a real pid, start time and argv[0] names a process that
fails one of the two.

A port's listener is ours only when every listening socket on that address and port belongs to
our process (`listener_owner`): a token is sent to a port only after that check, so a squatter
that bound the port first never receives one. A listener on another address with the same port
(a forwarder on the host's address while ours binds loopback) takes no connection made to our
address, so it is neither ours nor a squatter; a wildcard listener (0.0.0.0, ::) takes them, so
it counts.

Everything here asks `psutil`. Tested on Linux, where it reads /proc: there the start time is the
kernel's own tick count (the value state files have always recorded) and every listener on the
machine is visible, another user's included. Elsewhere it is expected to work with two
degradations: on macOS psutil lists sockets machine-wide only for root, so without root a
port counts as ours when the process we started listens there (the kernel then refuses a second
plain bind of it), and a listener it does not hold counts as foreign; and on Windows
there are no process groups, so `group_members` refuses with `ProcessError` instead of reporting
an empty group (a group stop would otherwise silently stop nothing).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal, TypeAlias

import psutil
from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.errors import ProcessError

NONCE_VARIABLE = "GRAPH_KVCACHE_PROCESS_NONCE"
"""Set in the environment of every child we spawn; the state record holds the same value."""
ListenerOwner: TypeAlias = Literal["ours", "none", "foreign"]
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)
_DEAD = frozenset({psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD})
# Linux's USER_HZ: the unit of the start time in /proc/<pid>/stat, which records always held.
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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
    """When `pid` started, in clock ticks since boot (on Linux the kernel's own figure); None
    when it is gone."""
    try:
        since_boot_s = psutil.Process(pid).create_time() - psutil.boot_time()
    except (*_GONE, ValueError):  # ValueError: a negative pid
        return None
    return round(since_boot_s * _TICKS_PER_S)


def is_alive(pid: int, ticks: int) -> bool:
    """True when `pid` runs and is the process that started at `ticks` (not a recycled pid)."""
    now = start_ticks(pid)
    return now is not None and now == ticks and not is_zombie(pid)


def is_ours(record: ProcessRecord) -> bool:
    """True when `record.pid` is still the very process we started: not a recycled pid, and not
    another user's process dressed up with the same pid, start time and argv[0]."""
    if not is_alive(record.pid, record.start_ticks):
        return False
    try:
        process = psutil.Process(record.pid)
        if not _same_user(process):
            return False
        cmdline = process.cmdline()
    except _GONE:
        return False
    if not cmdline or cmdline[0] != record.command[0]:
        return False
    return (
        record.nonce is not None and environment_value(record.pid, NONCE_VARIABLE) == record.nonce
    )


def _same_user(process: psutil.Process) -> bool:
    if hasattr(os, "geteuid"):
        return bool(process.uids().effective == os.geteuid())
    return bool(process.username() == psutil.Process().username())  # Windows: no uids


def environment_value(pid: int, name: str) -> str | None:
    """One variable of the environment `pid` started with (readable only for our own
    processes); None when unset or unreadable. Only `name` is kept: the rest (keys, tokens) is
    never returned."""
    try:
        environment: dict[str, str] = psutil.Process(pid).environ()
    except (*_GONE, ValueError):
        return None
    return environment.get(name)


def is_zombie(pid: int) -> bool:
    """True when `pid` has exited (gone, or a zombie not yet reaped)."""
    try:
        return psutil.Process(pid).status() in _DEAD
    except (*_GONE, ValueError):
        return True


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid`.

    Raises:
        ProcessError: this platform has no process groups (Windows).
    """
    if not hasattr(os, "getpgid"):
        raise ProcessError(
            "stopping a managed process's helpers needs process groups, which this platform "
            "lacks; start vLLM yourself and point the server at it with VLLM_BASE_URL"
        )
    members: list[int] = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() not in _DEAD:
                members.append(process.pid)
        except (*_GONE, ProcessLookupError, PermissionError):
            continue
    return sorted(members)


LOOPBACK_HOST = "127.0.0.1"
"""Where every service we manage listens; the address a listener check asks about by default."""


def describe_listener(port: int, *, host: str = LOOPBACK_HOST) -> str:
    """'pid N (name)' of whatever listens on `host`:`port`, best effort."""
    pid = listener_pid(port, host=host)
    if pid is None:
        return "owner unknown"
    try:
        name = psutil.Process(pid).name()
    except _GONE:
        name = "?"
    return f"pid {pid} ({name})"


def listener_owner(
    pid: int, port: int, *, group: bool = False, host: str = LOOPBACK_HOST
) -> ListenerOwner:
    """Who listens on TCP `host`:`port` (that address or a wildcard, IPv4 or IPv6): "ours" when
    every listening socket there is an open file of `pid` (or, with `group`, of a member of the
    process group `pid` leads), "none" when nothing listens, else "foreign" (a socket we cannot
    attribute included). A socket on another address with the same port is not counted.

    Sockets are matched by address, counted: psutil names one holder per socket, so a socket
    our engine shares with a child it forked is checked among our own process's files instead.
    """
    # Everyone's first, ours after: a socket our process binds in between is then not missed
    # from ours (which would read as foreign).
    try:
        everyone: Counter[tuple[int, str, int]] | None = Counter(
            _listening_addresses(psutil.net_connections(kind="tcp"), port, host)
        )
    except psutil.AccessDenied:  # macOS without root: only our own processes' sockets
        everyone = None
    if everyone is not None and not everyone:
        return "none"
    members = [pid]
    if group:
        members += [member for member in group_members(pid) if member != pid]
    ours: Counter[tuple[int, str, int]] = Counter()
    for member in members:
        ours.update(_listening_addresses(_sockets_of(member), port, host))
    if everyone is None:
        return "ours" if ours else ("foreign" if _answers(host, port) else "none")
    return "ours" if everyone <= ours else "foreign"


def listener_user(port: int, *, host: str = LOOPBACK_HOST) -> ListenerOwner:
    """Who listens on TCP `host`:`port`, by user: "ours" when every listening socket there
    belongs to a process running as our user (another user's squatter fails), "none" when nothing
    listens, else "foreign". For a port whose process we did not record (a coordinator given by
    URL)."""
    try:
        sockets = [
            found for found in psutil.net_connections(kind="tcp") if _listens_at(found, port, host)
        ]
    except psutil.AccessDenied:  # macOS without root: only our own processes' sockets
        mine = any(
            _listening_addresses(_sockets_of(process.pid), port, host)
            for process in psutil.process_iter()
            if _is_our_user(process.pid)
        )
        return "ours" if mine else ("foreign" if _answers(host, port) else "none")
    if not sockets:
        return "none"
    return "ours" if all(_is_our_user(found.pid) for found in sockets) else "foreign"


def _is_our_user(pid: int | None) -> bool:
    if pid is None:  # a holder hidden from us: not ours
        return False
    try:
        return _same_user(psutil.Process(pid))
    except _GONE:
        return False


def _sockets_of(pid: int) -> list[Any]:
    try:
        return list(psutil.Process(pid).net_connections(kind="tcp"))
    except (*_GONE, ValueError):
        return []


def _listening_addresses(
    sockets: Iterable[Any], port: int, host: str
) -> list[tuple[int, str, int]]:
    return [
        (found.family, found.laddr.ip, found.laddr.port)
        for found in sockets
        if _listens_at(found, port, host)
    ]


def _listens_at(found: Any, port: int, host: str) -> bool:
    """Whether psutil's socket `found` listens where a connection to `host`:`port` lands."""
    return (
        found.status == psutil.CONN_LISTEN
        and bool(found.laddr)
        and found.laddr.port == port
        and takes_connections_for(found.laddr.ip, host)
    )


def takes_connections_for(bound: str, host: str) -> bool:
    """Whether a socket bound to address `bound` takes connections made to `host`: the same
    address (an IPv4-mapped IPv6 one included) or a wildcard. Anything that is not an address
    (a name) counts, so the check errs towards "someone else is there"."""
    try:
        wanted = ipaddress.ip_address(host.strip("[]"))
        address = ipaddress.ip_address(bound.split("%", 1)[0])
    except ValueError:
        return True
    if address.is_unspecified:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if isinstance(wanted, ipaddress.IPv6Address) and wanted.ipv4_mapped is not None:
        wanted = wanted.ipv4_mapped
    return address == wanted


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def listener_pid(port: int, *, host: str = LOOPBACK_HOST) -> int | None:
    """The pid holding a listening TCP socket at `host`:`port`, when we are allowed to see it."""
    pids = sorted(pid for pid in _listeners(port, host) if pid is not None)
    return pids[0] if pids else None


def _listeners(port: int, host: str) -> set[int | None]:
    """The pids psutil names for the listening TCP sockets at `host`:`port` (one per socket;
    None where the holder is hidden from us)."""
    try:
        sockets = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # macOS without root
        return set()
    return {found.pid for found in sockets if _listens_at(found, port, host)}
