"""What each vLLM operation returns: one model per operation, the same for the tool and the CLI.

`graph-kvcache-mcp vllm <verb> --json` prints exactly the model the matching `vllm_*` tool returns.
Pure models; they import nothing that talks to vLLM, so the server can list tools without openai.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus
from graph_kvcache_mcp.connectors.vllm.state import VllmLogs, VllmStatus, VllmStopResult
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.chat import ChatResult, PrefixCacheReset, TierTokens
from graph_kvcache_mcp.domain.vllm.metrics import MetricsDelta, MetricsSnapshot
from graph_kvcache_mcp.domain.vllm.traces import Trace, TraceSummary
from graph_kvcache_mcp.domain.vllm.worker_death import WorkerDeath

MAX_BAD_LINES_SHOWN = 50

__all__ = [
    "MAX_BAD_LINES_SHOWN",
    "VllmChatOut",
    "VllmLogs",
    "VllmMetricsOut",
    "VllmResetOut",
    "VllmStatusOut",
    "VllmStopResult",
    "VllmTraceSummaryOut",
]


class VllmChatOut(BaseModel):
    """One call's answer and its cache accounting."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    base_url: str
    answer: str | None = None
    trace: Trace | None = Field(None, description="Tokens, cache hits and their source, latency.")
    reason: str | None = Field(None, description="Why vLLM could not answer.")

    @classmethod
    def from_result(cls, base_url: str, result: ChatResult | Unavailable) -> Self:
        if isinstance(result, Unavailable):
            return cls(reachable=False, base_url=base_url, reason=result.reason)
        return cls(reachable=True, base_url=base_url, answer=result.answer, trace=result.trace)


class VllmMetricsOut(BaseModel):
    """A /metrics snapshot, or what moved since an earlier one."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    metrics_url: str
    snapshot: MetricsSnapshot | None = None
    delta: MetricsDelta | None = Field(None, description="Present when `since` was given.")
    snapshot_id: str | None = Field(
        None, description="Pass as `since` to a later vllm_metrics call to get `delta`."
    )
    lmcache: LmcacheCounters | None = Field(
        None,
        description="The managed lmcache server behind vLLM's MP connector (totals since it "
        "started): lookups and where they hit, L1 or L2 (the engine).",
    )
    tiers: TierTokens = None
    reason: str | None = None


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


class VllmResetOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    reachable: bool
    reset: bool = False
    dev_mode: bool | None = None
    reason: str | None = None

    @classmethod
    def from_result(cls, result: PrefixCacheReset | Unavailable) -> Self:
        if isinstance(result, Unavailable):
            return cls(reachable=False, reason=result.reason)
        return cls(
            reachable=True, reset=result.reset, dev_mode=result.dev_mode, reason=result.reason
        )


class VllmTraceSummaryOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: Literal["file", "session"]
    path: str | None = None
    summary: TraceSummary
    bad_line_count: int = 0
    bad_lines: list[int] = Field(
        default_factory=list, description=f"First {MAX_BAD_LINES_SHOWN} lines that were not traces."
    )
