"""What the stack's tools return about the managed engine, `lmcache server` and vLLM: each
process's status (its connector's `state.py` model) plus this server session's part in it
(which engine the KV tools use, the leases it holds, what happens on exit; where vLLM calls
go)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field

from graph_kvcache_mcp.connectors.engine.access import KvAccess
from graph_kvcache_mcp.connectors.engine.state import EngineStatus
from graph_kvcache_mcp.connectors.lmcache.access import LmcacheAccess
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus
from graph_kvcache_mcp.connectors.vllm.state import VllmStatus
from graph_kvcache_mcp.domain.vllm.worker_death import WorkerDeath


class EngineStatusOut(EngineStatus):
    """The managed engine's status, plus which engine the KV tools use and what happens on exit."""

    kv_source: Literal["configured", "managed"] = Field(
        description="configured: KV tools use EPISTEMIC_GRAPH_KVCACHE_URL; managed: this engine."
    )
    kv_base_url: str | None = Field(
        None, description="Where KV tools send requests now (null until first use)."
    )
    started_by_this_server: bool = False
    holds_lease: bool = Field(
        False, description="True while this server session uses the managed engine (a lease)."
    )
    stops_on_exit: bool = Field(
        False,
        description="True when this server stops the engine on exit, should it be the last "
        "session holding a lease (false with --keep-engine or for an engine started by "
        "`graph-kvcache-mcp engine start`).",
    )

    @classmethod
    def build(cls, status: EngineStatus, access: KvAccess) -> EngineStatusOut:
        info = access.info()
        return cls(
            **status.model_dump(),
            kv_source=info.source,
            kv_base_url=info.base_url,
            started_by_this_server=info.started_pid is not None and info.started_pid == status.pid,
            holds_lease=info.holds_lease,
            stops_on_exit=info.stops_on_exit,
        )


class LmcacheStatusOut(LmcacheStatus):
    """The managed server's status, plus whether this session holds a lease on it."""

    holds_lease: bool = Field(
        False, description="True while this server session uses the lmcache server (a lease)."
    )

    @classmethod
    def build(cls, status: LmcacheStatus, access: LmcacheAccess) -> LmcacheStatusOut:
        return cls(**status.model_dump(), holds_lease=access.holds_lease)


class VllmStatusOut(VllmStatus):
    tools_base_url: str = Field(description="Where vllm_chat and vllm_metrics send requests now.")
    lmcache: LmcacheStatus | None = Field(
        None, description="The lmcache server vLLM's MP connector uses (stack start only)."
    )
    l2_engine_url: str | None = Field(None, description="The engine the server's L2 writes to.")
    stack_notes: list[str] = Field(
        default_factory=list, description="Why the lmcache server got its flags."
    )
    worker_death: WorkerDeath | None = Field(
        None, description="How its worker died since its last start (from its log), if it did."
    )

    @classmethod
    def of(cls, status: VllmStatus, tools_base_url: str) -> Self:
        return cls(**status.model_dump(), tools_base_url=tools_base_url)
