"""Output models of the fleet_* tools and `fleet` commands (one per operation)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.fleet.findings import (
    FleetFinding,
    InstanceFacts,
    PressureRank,
    SourceSplit,
)
from graph_kvcache_mcp.domain.fleet.freshness import Freshness
from graph_kvcache_mcp.domain.fleet.memory import FleetMemory
from graph_kvcache_mcp.domain.fleet.tiers import TierHeld
from graph_kvcache_mcp.domain.vllm.chat import TierTokens


class IndexInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    blocks: int = Field(description="Distinct blocks (by token content) the index holds.")
    max_blocks: int = Field(description="Its bound; past it the oldest are forgotten.")
    forgotten: int = Field(description="Blocks dropped by the bound (answers may be short).")


class InstanceWhere(BaseModel):
    """One instance's answer for one prompt."""

    model_config = ConfigDict(frozen=True)

    name: str
    reachable: bool
    reason: str | None = None
    prompt_tokens: int | None = Field(None, description="Tokens of the prompt on this instance.")
    block_size: int | None = None
    cached_tokens: int | None = Field(
        None,
        description="Predicted cached_tokens of its next request for this prompt (whole "
        "blocks, never the last prompt token). None: unknown (no feed, unreachable).",
    )
    held_tokens: int | None = Field(
        None, description="Leading prompt tokens it holds, before vLLM's last-token rule."
    )
    by_medium: dict[str, int] = Field(
        default_factory=dict, description="Leading prompt tokens held per medium (GPU, CPU, …)."
    )
    trusted: bool = Field(
        description="False when its feed is not live or, on a hybrid, not every KV cache group "
        "is known (reason says): treat as a guess."
    )
    freshness: Freshness
    tiers: dict[str, TierHeld] = Field(
        default_factory=dict,
        description="With an LMCache server: leading prompt tokens per tier (vllm, l1, l2).",
    )


class FleetWhereOut(BaseModel):
    """fleet_where_cached: where a prompt's prefix is cached, per instance."""

    model_config = ConfigDict(frozen=True)

    reachable: bool = Field(description="False when no instance answered.")
    instances: list[InstanceWhere]
    best: str | None = Field(None, description="The instance to send it to.")
    why: str | None = None
    shared_tier: str | None = Field(
        None,
        description="What is known of the shared tier (engine/LMCache) for this prefix; the "
        "fleet view sees vLLM's own caches only.",
    )
    index: IndexInfo


class CachedPrefix(BaseModel):
    model_config = ConfigDict(frozen=True)

    tokens: int = Field(description="Length of the cached chain, in tokens.")
    head: str | None = Field(None, description="Its first tokens, decoded.")
    holders: dict[str, list[str]] = Field(description="Instance → media holding all of it.")


class FleetStatusOut(BaseModel):
    """fleet_status: the fleet's facts, what keeps it from sharing, who is pressed, the index."""

    model_config = ConfigDict(frozen=True)

    instances: list[InstanceFacts]
    findings: list[FleetFinding]
    pressure: list[PressureRank] = Field(description="Most pressed first.")
    prefixes: list[CachedPrefix] = Field(description="Longest cached prefixes, longest first.")
    index: IndexInfo
    memory: FleetMemory | None = Field(None, description="LMCache L1 per server, shared L2.")


class InstanceEffect(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    reachable: bool
    reason: str | None = None
    split: SourceSplit | None = Field(
        None, description="Prompt tokens by source in the window (None: not exported)."
    )
    tiers: TierTokens = None
    engine_kv_loaded_blocks: int | None = Field(
        None, description="Blocks EngineKVConnector loaded from the engine in the window."
    )
    engine_kv_saved_blocks: int | None = None


class FleetEffectivenessOut(BaseModel):
    """fleet_effectiveness: what the caches paid over a window, per instance and in all."""

    model_config = ConfigDict(frozen=True)

    snapshot_id: str | None = Field(None, description="Pass as since to measure from now.")
    since: str | None = Field(None, description="The window's start; None: since each start.")
    window_s: float | None = None
    instances: list[InstanceEffect]
    fleet: SourceSplit
