"""What every managed process needs: identity checks, port checks, staged stop. Linux /proc based.

A process is ours only when the pid in our state file is alive **and** its kernel start time and
command line match what we recorded when we started it, so a recycled pid is never signalled.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Generic, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from graph_kvcache_mcp.connectors.private_files import open_private_log, read_private
from graph_kvcache_mcp.connectors.private_files import write_private as write_private

CHILD_UMASK = 0o077
StopHow: TypeAlias = Literal["terminated", "killed", "not_running"]


class ProcessRecord(BaseModel):
    """What we write down about a process we started."""

    model_config = ConfigDict(frozen=True)

    pid: int
    start_ticks: int
    command: tuple[str, ...]
    started_at: float
    log_path: str


class ProcessState(BaseModel):
    """Base of a state file's model: the process we started, plus what its manager adds."""

    model_config = ConfigDict(frozen=True)

    process: ProcessRecord


StateT = TypeVar("StateT", bound=ProcessState)


class StateFile(Generic[StateT]):
    """The JSON file (0600) where a manager records the process it started, read back as `model`.

    The path is read on every call, so a record written or removed by another process (or a
    test) is seen at once.
    """

    def __init__(self, path: Path, model: type[StateT]) -> None:
        self.path = path
        self.model = model

    def read(self) -> StateT | None:
        """The recorded state, when the file exists and is readable.

        Raises:
            ConfigError: the state file is a symbolic link.
        """
        try:
            text = read_private(self.path)
        except OSError:
            return None
        if text is None:
            return None
        try:
            return self.model.model_validate_json(text)
        except ValidationError:
            return None

    def read_live(self, *, tidy: bool = True) -> StateT | None:
        """The recorded state when its process is still the one we started; a stale record is
        removed when `tidy` (read-only callers leave it)."""
        state = self.read()
        if state is None:
            return None
        if is_ours(state.process):
            return state
        if tidy:
            self.clear()
        return None

    def write(self, state: StateT) -> None:
        write_private(self.path, state.model_dump_json(indent=2))

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
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
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace") == record.command[0]


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until `pid` exits (reaping it when it is our child); True when it is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return True
            our_child = True
        except ChildProcessError:
            our_child = False
        if start_ticks(pid) is None:
            return True
        # A zombie that is not our child is as gone as we can see. Our own child is gone once
        # reaped: its leader thread shows as a zombie while the other threads still exit, and
        # waitpid cannot reap it until they have.
        if not our_child and is_zombie(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_process(record: ProcessRecord, *, term_wait_s: float, kill_wait_s: float = 5.0) -> StopHow:
    """SIGTERM, wait, then SIGKILL — only when `record` is still ours. Returns what happened.

    Signals the whole process group when the process leads one (we start children in their own
    session), so helpers it spawned go too.
    """
    if not is_ours(record):
        return "not_running"
    target_group = os.getpgid(record.pid) == record.pid

    def send(sig: signal.Signals) -> None:
        try:
            if target_group:
                os.killpg(record.pid, sig)
            else:
                os.kill(record.pid, sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    if wait_gone(record.pid, term_wait_s):
        return "terminated"
    send(signal.SIGKILL)
    wait_gone(record.pid, kill_wait_s)
    return "killed"


def spawn_logged(
    command: tuple[str, ...],
    *,
    env: Mapping[str, str],
    log_path: Path,
    header: str | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start `command` in its own session (so it can be stopped as a group) with stdout and
    stderr appended to `log_path` (0600, after `header`, when given); returns it and its record.

    The child gets exactly `env` and umask 077, so what it writes (its store, its own logs) is
    private too.
    """
    with open_private_log(log_path) as log:
        if header is not None:
            log.write(header.encode())
            log.flush()
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            umask=CHILD_UMASK,
        )
    ticks = start_ticks(process.pid)
    record = ProcessRecord(
        pid=process.pid,
        start_ticks=ticks if ticks is not None else -1,
        command=command,
        started_at=time.time(),
        log_path=str(log_path),
    )
    return process, record


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on (host, port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    """True once nothing listens on (host, port), polling up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while port_in_use(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def tail(path: Path, lines: int = 20, *, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
