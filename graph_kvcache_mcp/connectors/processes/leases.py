"""Leases on the managed engine: one small file per server session that uses it.

`<data dir>/engine/leases/<pid>-<random>.json` (0600) records the session's pid and the kernel's
start time of that process. A lease is live while that very process runs; one whose process is
gone, or whose pid now belongs to another process, is stale and removed by whoever looks next
(a starting session, `engine status`). The engine's manager stops the engine when the last live
lease is dropped, unless the engine was started to run until `engine stop` (`lease_rules`). The
managed `lmcache server` keeps its leases the same way under `<data dir>/lmcache/leases/`.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graph_kvcache_mcp.connectors.files.private import read_private, write_private
from graph_kvcache_mcp.connectors.processes.identity import is_alive, start_ticks
from graph_kvcache_mcp.errors import ConfigError


class Lease(BaseModel):
    """A server session's claim on a managed process (the engine, the lmcache server)."""

    model_config = ConfigDict(frozen=True)

    pid: int = Field(description="Process id of the server session holding the lease.")
    start_ticks: int = Field(description="Kernel start time of that process (tells recycled pids).")
    taken_at: float = Field(description="Unix time the lease was taken.")


class Leases:
    """The lease files of one engine home."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __repr__(self) -> str:
        return f"Leases({str(self.directory)!r})"

    def take(self) -> Path:
        """Write a lease for this process (clearing stale ones); returns its path."""
        self.live()  # the next session is one of those who clear what killed sessions left
        pid = os.getpid()
        ticks = start_ticks(pid)
        lease = Lease(pid=pid, start_ticks=ticks if ticks is not None else -1, taken_at=time.time())
        # A random part: several sessions may live in one process (tests, an HTTP server's
        # in-memory clients), each with its own lease.
        path = self.directory / f"{pid}-{secrets.token_hex(4)}.json"
        write_private(path, lease.model_dump_json())
        return path

    def drop(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def live(self, *, tidy: bool = True) -> dict[Path, Lease]:
        """Every live lease by path; stale and unreadable ones are removed when `tidy`."""
        try:
            paths = sorted(self.directory.glob("*.json"))
        except OSError:
            return {}
        found: dict[Path, Lease] = {}
        for path in paths:
            lease = _read(path)
            if lease is not None and is_alive(lease.pid, lease.start_ticks):
                found[path] = lease
            elif tidy:
                path.unlink(missing_ok=True)
        return found


def _read(path: Path) -> Lease | None:
    try:
        text = read_private(path)
    except (OSError, ConfigError):  # a link where a lease should be counts as no lease
        return None
    if text is None:
        return None
    try:
        return Lease.model_validate_json(text)
    except ValidationError:
        return None
