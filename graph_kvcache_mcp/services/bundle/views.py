"""Output models for bundle operations, shared by the MCP tools and the CLI (`--json`)."""

from __future__ import annotations

import hashlib
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.bundle import (
    Bundle,
    CacheState,
    ChatMessage,
    RejectedBundle,
    SelectedItem,
)
from graph_kvcache_mcp.domain.bundle.compiled import PPM
from graph_kvcache_mcp.domain.outcomes import Miss, Unavailable
from graph_kvcache_mcp.domain.vllm.traces import Trace
from graph_kvcache_mcp.services.bundle.bundles import BundleChat, CompileResult


class BundleItemOut(BaseModel):
    """One selected item, summarized (its text is in the bundle text)."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: str
    tokens: int = Field(description="Tokens it added to the bundle (block, citation, edges).")
    score: float = Field(description="Composite score 0-1 (never part of the rendered text).")
    relevance: float
    evidence: float
    freshness: float
    relevance_source: Literal["caller", "lexical"]
    sources: int = Field(description="How many source refs it cites.")

    @classmethod
    def from_item(cls, item: SelectedItem) -> Self:
        return cls(
            id=item.id,
            kind=item.kind,
            tokens=item.tokens,
            score=item.score_ppm / PPM,
            relevance=item.relevance_ppm / PPM,
            evidence=item.evidence_ppm / PPM,
            freshness=item.freshness_ppm / PPM,
            relevance_source=item.relevance_source,
            sources=len(item.source_refs),
        )


class BundleCompileOut(BaseModel):
    """A compiled bundle's summary, and how the KV store cache took part."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(description="The bundle's content-addressed key (for bundle_render/chat).")
    cache: CacheState
    kv_cache_hit: bool
    assembled: bool = Field(description="False on a hit: scoring/MMR/budget fit were skipped.")
    stored: Literal["stored_new", "already_present"] | None = None
    store_reachable: bool | None = Field(
        None, description="False when the KV store could not be used; None when the cache is off."
    )
    reason: str | None = Field(None, description="Why the cache could not serve or store.")
    token_counter: str
    token_budget: int
    tokens_used: int
    candidates: int
    selected: int
    dropped_over_budget: int
    dropped_by_top_k: int
    relations_outside: int = Field(description="Relations not drawn: an end was not selected.")
    citations: int
    proof_edges: int
    items: list[BundleItemOut]
    text: str | None = Field(None, description="The rendered bundle, only when asked for.")
    text_sha256: str = Field(description="SHA-256 of the rendered text: equal text, equal hash.")
    lookup_ms: float | None = None
    assemble_ms: float | None = None
    total_ms: float

    @classmethod
    def from_result(cls, result: CompileResult, *, include_text: bool = False) -> Self:
        bundle = result.bundle
        text = bundle.text()
        return cls(
            key=bundle.key,
            cache=result.cache,
            kv_cache_hit=result.kv_cache_hit,
            assembled=result.assembled,
            stored=result.stored,
            store_reachable={"off": None, "unavailable": False}.get(result.cache, True),
            reason=result.reason,
            token_counter=bundle.token_counter,
            token_budget=bundle.token_budget,
            tokens_used=bundle.tokens_used,
            candidates=bundle.candidates,
            selected=len(bundle.items),
            dropped_over_budget=bundle.dropped_over_budget,
            dropped_by_top_k=bundle.dropped_by_top_k,
            relations_outside=bundle.relations_outside,
            citations=len(bundle.citations),
            proof_edges=len(bundle.edges),
            items=[BundleItemOut.from_item(item) for item in bundle.items],
            text=text if include_text else None,
            text_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
            lookup_ms=result.lookup_ms,
            assemble_ms=result.assemble_ms,
            total_ms=result.total_ms,
        )


LoadOutcome = Bundle | Miss | RejectedBundle | Unavailable


class BundleRenderOut(BaseModel):
    """The chat messages for one turn over a stored bundle."""

    model_config = ConfigDict(frozen=True)

    key: str
    reachable: bool = Field(description="False when the KV store could not be read.")
    found: bool = Field(description="False when no usable bundle is stored under the key.")
    reason: str | None = None
    messages: list[ChatMessage] = Field(default_factory=list)
    system_sha256: str | None = Field(
        None, description="SHA-256 of the system message: equal across turns of one bundle."
    )
    system_chars: int | None = None

    @classmethod
    def from_messages(cls, key: str, messages: list[ChatMessage]) -> Self:
        system = messages[0].content
        return cls(
            key=key,
            reachable=True,
            found=True,
            messages=messages,
            system_sha256=hashlib.sha256(system.encode("utf-8")).hexdigest(),
            system_chars=len(system),
        )

    @classmethod
    def not_served(cls, key: str, outcome: Miss | RejectedBundle | Unavailable) -> Self:
        match outcome:
            case Unavailable(reason=reason):
                return cls(key=key, reachable=False, found=False, reason=reason)
            case RejectedBundle(reason=reason):
                return cls(key=key, reachable=True, found=False, reason=f"unusable: {reason}")
            case Miss():
                return cls(
                    key=key,
                    reachable=True,
                    found=False,
                    reason="no bundle stored under this key: compile it first (bundle_compile)",
                )


class BundleChatOut(BaseModel):
    """The model's answer over a stored bundle, with the call's prefix-cache Trace."""

    model_config = ConfigDict(frozen=True)

    key: str
    found: bool = Field(description="False when no usable bundle is stored under the key.")
    reachable: bool = Field(description="False when the KV store or vLLM could not be reached.")
    reason: str | None = None
    answer: str | None = None
    trace: Trace | None = Field(
        None, description="Prompt tokens, prefix_cache_hit_tokens (cached), latency, source."
    )
    system_sha256: str | None = Field(
        None, description="SHA-256 of the system message: equal across turns of one bundle."
    )

    @classmethod
    def from_chat(cls, key: str, chat: BundleChat) -> Self:
        return cls(
            key=key,
            found=True,
            reachable=True,
            answer=chat.answer,
            trace=chat.trace,
            system_sha256=chat.system_sha256,
        )

    @classmethod
    def from_render(cls, render: BundleRenderOut) -> Self:
        """A bundle that could not be served: carry the render result's reason."""
        return cls(
            key=render.key, found=render.found, reachable=render.reachable, reason=render.reason
        )

    @classmethod
    def vllm_down(cls, key: str, outcome: Unavailable) -> Self:
        return cls(key=key, found=True, reachable=False, reason=outcome.reason)
