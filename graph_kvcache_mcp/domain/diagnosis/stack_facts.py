"""What each component of the KV-cache stack reported, and the findings drawn from it. Pure.

The service gathers one `*Facts` per component (None: not checked); the rules in
`engine_findings`, `vllm_findings` and `lmcache_findings` turn them into `Finding`s with fixed
ids, and `stack_findings` puts them together. The facts hold no token, so no evidence does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.vllm.hybrid.launch import HybridRun
from graph_kvcache_mcp.domain.vllm.metrics import CacheConfig
from graph_kvcache_mcp.domain.vllm.worker_death import WorkerDeath

Severity = Literal["error", "warning", "info"]
NOT_READABLE = (
    "For a component this data dir did not start: which facts of its process (environment, "
    "log, command line) cannot be read here, and why. None for the managed one."
)
Component = Literal["engine", "vllm", "lmcache"]


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    severity: Severity
    component: Component
    evidence: str
    fix: str


class Checked(BaseModel):
    """One component the diagnosis tried to reach."""

    model_config = ConfigDict(frozen=True)

    component: Component
    target: str
    reachable: bool


class StackDiagnosis(BaseModel):
    """Tool and CLI output of diagnose_stack."""

    model_config = ConfigDict(frozen=True)

    findings: list[Finding]
    checked: list[Checked]

    @property
    def any_reachable(self) -> bool:
        return any(c.reachable for c in self.checked)

    @property
    def has_error(self) -> bool:
        return any(f.severity == "error" for f in self.findings)


class EngineFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: str
    source: Literal["configured", "managed", "default"]
    reachable: bool
    status: int | None = None
    reason: str | None = None
    backend: str | None = None


class VllmFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: str
    reachable: bool
    reason: str | None = None
    model: str | None = None
    version: str | None = None
    cache_config: CacheConfig | None = None
    prompt_tokens_details: bool | None = Field(
        None, description="Whether a probe call's usage carried prompt_tokens_details."
    )
    kv_cache_usage: float | None = None
    preemptions: int | None = None
    external_queries: int | None = None
    external_hits: int | None = None
    prefix_hits: int | None = Field(None, description="vLLM's own prefix-cache hits (tokens).")
    connector_lookup_tokens: int | None = Field(
        None, description="Tokens LMCache was asked for (its lookup counters), when known."
    )
    connector_found_tokens: int | None = Field(
        None, description="Of those, tokens LMCache held (L1 + L2)."
    )
    shared_prefix_tokens: int | None = Field(
        None, description="The prefix requests are meant to share (given, or a session's)."
    )
    kv_connector: str | None = Field(None, description="The managed vLLM's kv_connector, if any.")
    hash_seed: str | None = Field(None, description="PYTHONHASHSEED of the managed vLLM.")
    platform: Literal["cpu", "gpu"] | None = Field(None, description="The managed vLLM's.")
    hybrid: HybridRun | None = Field(None, description="The hybrid it serves, if one.")
    lmcache_target: str | None = Field(
        None, description="host:port the managed vLLM's MP connector talks to."
    )
    lmcache_target_answers: bool | None = Field(
        None, description="Whether anything listens on lmcache_target."
    )
    lmcache_transfer_mode: str | None = Field(
        None, description="LMCACHE_MP_TRANSFER_MODE in the managed vLLM's environment."
    )
    worker_death: WorkerDeath | None = Field(
        None, description="How the managed vLLM's worker died since its last start (its log)."
    )
    not_readable: str | None = Field(None, description=NOT_READABLE)


class LmcacheFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: str
    reachable: bool
    reason: str | None = None
    version: str | None = None
    unhealthy_l2: list[str] = Field(default_factory=list)
    hash_seed: str | None = None
    chunk_size: int | None = None
    l2_adapters: int | None = Field(None, description="How many L2 adapters /status lists.")
    transfer_mode: str | None = Field(
        None,
        description="Its --supported-transfer-mode (LMCache's default lmcache_driven when the "
        "flag is absent): the managed server's recorded one, else what /config reports.",
    )
    rpc_port: int | None = Field(None, description="Its ZMQ port (recorded, else /config's).")
    registration_hang: str | None = Field(
        None, description="The server log's line saying it cannot register vLLM's KV caches."
    )
    leaked_segments: list[str] = Field(
        default_factory=list,
        description="/dev/shm/lmcache_kv_<pid>_* segments whose process is gone.",
    )
    resp_peer_gone: str | None = Field(
        None, description="Why the managed server's resp L2 adapter lost its engine."
    )
    lookup_tokens: int | None = Field(None, description="Tokens vLLM's connectors looked up.")
    found_tokens: int | None = Field(None, description="Of those, tokens it held (L1 + L2).")
    not_readable: str | None = Field(None, description=NOT_READABLE)
