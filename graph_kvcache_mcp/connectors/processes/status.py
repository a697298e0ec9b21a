"""What every managed process reports: one status and one stop result, subclassed per subsystem.

The engine (`connectors/engine/state.py`), the `lmcache server` (`connectors/lmcache/state.py`)
and vLLM (`connectors/vllm/state.py`) answer status and stop with these fields under these
names; each subclass adds only what its process has of its own (ports, URLs, model, leases).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.processes.control import StopHow
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
