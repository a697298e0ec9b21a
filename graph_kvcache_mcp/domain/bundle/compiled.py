"""A compiled bundle: exactly what is stored, and everything rendering needs. Pure.

Only strings and integers (scores in parts per million), so the canonical JSON of a bundle is
unambiguous and a bundle read back from the store is equal, field for field, to the one stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.bundle.models import RelationType
from graph_kvcache_mcp.domain.bundle.render import (
    DEFAULT_PREAMBLE,
    ChatMessage,
    prompt_messages,
    render_text,
)

FORMAT_VERSION: Literal["ctxbundle/1"] = "ctxbundle/1"
"""Bumped whenever the stored shape or the rendered text changes: it is part of every key."""

PPM = 1_000_000


class SelectedItem(BaseModel):
    """A chosen item with its text and scores (scores are for people; they are never rendered)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    id: str
    kind: str
    text: str
    source_refs: tuple[str, ...]
    tokens: int = Field(description="Tokens this item added: its block, citation and new edges.")
    score_ppm: int = Field(description="Composite score, parts per million.")
    relevance_ppm: int
    evidence_ppm: int
    freshness_ppm: int
    relevance_source: Literal["caller", "lexical"]


class ProofEdge(BaseModel):
    """A relation between two selected items."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    source: str
    relation: RelationType
    target: str


class Citation(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    source_refs: tuple[str, ...]


class Bundle(BaseModel):
    """The stored form of a compiled bundle (`codec` adds the envelope and checksum)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    format: Literal["ctxbundle/1"] = FORMAT_VERSION
    key: str = Field(description="The cache key this bundle was compiled under.")
    policy_version: str
    token_counter: str = Field(description="Which counter fitted the budget (estimate or exact).")
    token_budget: int
    tokens_used: int = Field(description="Tokens of the text as counted by the budget fit.")
    candidates: int
    dropped_over_budget: int = Field(description="Candidates skipped because they did not fit.")
    dropped_by_top_k: int = Field(description="Candidates left once top_k items were chosen.")
    relations_outside: int = Field(
        description="Declared relations not drawn because an end was not selected (or unknown)."
    )
    items: tuple[SelectedItem, ...]
    edges: tuple[ProofEdge, ...]

    @property
    def citations(self) -> list[Citation]:
        return [Citation(id=i.id, source_refs=i.source_refs) for i in self.items if i.source_refs]

    def text(self) -> str:
        """The rendered bundle: the same bytes for a fresh compile and a cache hit."""
        return render_text(
            ((i.id, i.kind, i.text, i.source_refs) for i in self.items),
            ((e.source, e.relation, e.target) for e in self.edges),
        )

    def as_prompt_messages(
        self,
        turn_text: str,
        *,
        system_preamble: str = DEFAULT_PREAMBLE,
        history: Sequence[ChatMessage] | None = None,
    ) -> list[ChatMessage]:
        """[system (preamble + bundle), *history, user (turn_text)].

        Raises:
            ValueError: history holds a system message.
        """
        return prompt_messages(
            self.text(), turn_text, system_preamble=system_preamble, history=history
        )
