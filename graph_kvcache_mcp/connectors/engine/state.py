"""What the managed engine's lifecycle records and reports: the state file's model, the RESP
credentials, and the results of status and stop. Pure data: the lifecycle is `process`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from graph_kvcache_mcp.connectors.processes.lease_rules import LeasedState
from graph_kvcache_mcp.connectors.processes.status import LeasedStatus, StopResult

Backend = Literal["durable", "memory"]


class EngineState(LeasedState):
    """`state.json`: the engine we started. Holds no secret."""

    port: int
    backend: Backend
    base_url: str
    data_dir: str
    resp_port: int | None = None


class RespCredentials(BaseModel):
    """Where and as whom to reach the managed engine's RESP wire."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int
    user: str
    password: SecretStr


class EngineStatus(LeasedStatus):
    """What `engine status` / `engine start` report."""

    reachable: bool = False
    port: int | None = None
    base_url: str | None = None
    backend: Backend | None = None
    resp_address: str | None = Field(
        None, description="host:port of the engine's RESP wire, when it was started with one."
    )


class EngineStopResult(StopResult):
    """What `engine stop` did."""
