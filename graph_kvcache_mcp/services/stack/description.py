"""The running managed stack as one typed value, read from our state files: which engine, which
`lmcache server` (and the coordinator it joined), which vLLM and how its KV tier is wired.

Restart proofs and the lifecycle verbs read this instead of asking each process connector or
parsing a running process's command line. Each part is that process's own state record (one
model per concept); reading them signals nothing and tidies no state file.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.state import EngineState
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import (
    CoordinatorState,
    ManagedCoordinator,
)
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheState
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmState
from graph_kvcache_mcp.domain.lmcache.config import MP_CONNECTOR_CLASS


class CoordinatorPart(BaseModel):
    """The coordinator the server joined, or the data dir's own when it runs alone."""

    model_config = ConfigDict(frozen=True)

    url: str
    managed: bool = Field(description="Started from the data dir: stops with its server.")
    pid: int | None = Field(None, description="Ours only: one named by URL is not.")


class StackDescription(BaseModel):
    """What of the managed stack runs for one data dir (live processes only)."""

    model_config = ConfigDict(frozen=True)

    data_dir: str
    engine: EngineState | None = None
    lmcache: LmcacheState | None = None
    coordinator: CoordinatorPart | None = None
    vllm: VllmState | None = None

    @property
    def connector(self) -> str | None:
        """The KV connector class the managed vLLM runs, None without one (or without vLLM)."""
        return None if self.vllm is None else self.vllm.wiring.connector

    @property
    def vllm_server(self) -> LmcacheState | None:
        """The managed lmcache server the managed vLLM's MP connector talks to, if it is ours."""
        if self.vllm is None or self.lmcache is None or self.connector != MP_CONNECTOR_CLASS:
            return None
        return self.lmcache if self.vllm.wiring.lmcache_port == self.lmcache.port else None


def describe_stack(data_dir: Path) -> StackDescription:
    """The managed stack of `data_dir` as its state files record it."""
    server = ManagedLmcache(data_dir).running_state(tidy=False)
    joined = None if server is None else server.wiring.coordinator_url
    ours = ManagedCoordinator(data_dir).running_state(tidy=False)
    return StackDescription(
        data_dir=str(data_dir.expanduser().resolve()),
        engine=ManagedEngine(data_dir).running_state(tidy=False),
        lmcache=server,
        coordinator=_coordinator(joined, ours),
        vllm=ManagedVllm(data_dir, tidy=False).running_state(),
    )


def _coordinator(joined: str | None, ours: CoordinatorState | None) -> CoordinatorPart | None:
    if joined is not None and (ours is None or ours.url != joined):
        return CoordinatorPart(url=joined, managed=False)
    if ours is None:
        return None
    return CoordinatorPart(url=ours.url, managed=True, pid=ours.process.pid)
