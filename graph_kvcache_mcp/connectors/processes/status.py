"""What every managed process reports: one status and one stop result, subclassed per subsystem.

The engine (`connectors/engine/state.py`), the `lmcache server` (`connectors/lmcache/state.py`)
and vLLM (`connectors/vllm/state.py`) answer status and stop with these fields under these
names; each subclass adds only what its process has of its own (ports, URLs, model, leases).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.processes.control import StopHow
from graph_kvcache_mcp.connectors.processes.identity import ProcessRecord
from graph_kvcache_mcp.connectors.processes.leases import Lease


class ProcessStatus(BaseModel):
    """A managed process as `status` and `start` report it."""

    model_config = ConfigDict(frozen=True)

    running: bool
    managed_by_us: bool = False
    reused: bool = False
    pid: int | None = None
    uptime_s: float | None = None
    log_path: str | None = None
    data_dir: str
    reason: str | None = None


class RunningFields(TypedDict):
    running: bool
    managed_by_us: bool
    pid: int
    uptime_s: float
    log_path: str
    data_dir: str


def running_fields(record: ProcessRecord, data_dir: Path) -> RunningFields:
    """The shared status fields of a process we started and that still runs, from its record."""
    return RunningFields(
        running=True,
        managed_by_us=True,
        pid=record.pid,
        uptime_s=round(time.time() - record.started_at, 3),
        log_path=record.log_path,
        data_dir=str(data_dir),
    )


class LeasedStatus(ProcessStatus):
    """A managed process that server sessions share through leases (the engine, lmcache)."""

    runs_until_stop: bool | None = Field(
        None,
        description="True: runs until its `stop` command; false: stops when the last session "
        "using it exits.",
    )
    leases: list[Lease] = Field(
        default_factory=list, description="Live server sessions using this process."
    )


class StopResult(BaseModel):
    """What stopping a managed process did."""

    model_config = ConfigDict(frozen=True)

    stopped: bool
    how: StopHow
    pid: int | None = None
    data_dir: str
    reason: str | None = None
