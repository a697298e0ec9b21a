"""What the managed `lmcache server`'s lifecycle records and reports: the state file's model and
the results of status and stop. Pure data: the lifecycle is `process`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.processes.lease_rules import LeasedState
from graph_kvcache_mcp.connectors.processes.status import LeasedStatus, StopResult
from graph_kvcache_mcp.domain.lmcache.status import LmcacheServerReport
from graph_kvcache_mcp.domain.vllm.wiring import LmcacheWiring, lmcache_wiring_of


class RespPeer(BaseModel):
    """The process whose RESP wire the server's `resp` L2 adapter connected to at start."""

    model_config = ConfigDict(frozen=True)

    pid: int
    start_ticks: int
    address: str = Field(description="host:port of the RESP wire.")


class LmcacheState(LeasedState):
    """`state.json`: the server we started. Holds no secret."""

    host: str
    port: int
    http_port: int
    http_url: str
    rpc_url: str | None = Field(
        None, description="The private ipc socket its KV RPC serves on instead of TCP `port`."
    )
    resp_peer: RespPeer | None = None
    plan_env: dict[str, str] = Field(
        default_factory=dict,
        description="The plan's environment with `${NAME}` references, never their values: a "
        "restart fills them in again.",
    )
    lmcache_wiring: LmcacheWiring | None = Field(
        None,
        description="Its arguments, coordinator and L2 target, read from the command we built.",
    )

    @property
    def wiring(self) -> LmcacheWiring:
        """How it runs; a record written before `lmcache_wiring` existed (an upgrade with the
        server running) is read from its recorded command, after `python -m <entry module>`."""
        return self.lmcache_wiring or lmcache_wiring_of(self.process.command[3:])


class LmcacheStatus(LeasedStatus):
    """What `lmcache status` / `lmcache start` report."""

    healthy: bool = False
    rpc_url: str | None = Field(None, description="Where vLLM's MP connector connects.")
    http_url: str | None = None
    report: LmcacheServerReport | None = Field(None, description="From GET /status.")
    startup_s: float | None = None
    coordinator_url: str | None = Field(None, description="The LMCache coordinator it joined.")
    resp_peer_gone: str | None = Field(
        None,
        description="Set when the engine the `resp` L2 adapter connected to has stopped or "
        "restarted since the server started: L2 is dead until the server restarts.",
    )


class LmcacheStopResult(StopResult):
    """What `lmcache stop` did."""

    also_stopped: list[str] = Field(
        default_factory=list,
        description="What was stopped with it: a vLLM that used it (first), the managed "
        "coordinator it joined (after).",
    )
