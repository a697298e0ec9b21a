"""Inputs of a bundle compile: evidence items and the parameters that steer selection. Pure.

Validation normalizes everything that could make equal content look different (timestamps to UTC,
relations sorted, -0.0 to 0.0), so the cache key depends on meaning, not on spelling.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

RelationType = Literal["supports", "contradicts", "alternative_to"]
RELATION_TYPES: tuple[RelationType, ...] = ("supports", "contradicts", "alternative_to")

MAX_ID_CHARS = 256
MAX_KIND_CHARS = 64
MAX_REF_CHARS = 512
MAX_TEXT_CHARS = 200_000
MAX_ITEMS = 5_000


def _one_line(value: str, what: str) -> str:
    # Ids, kinds and refs sit inside single rendered lines: a line break there would let one item
    # forge the structure of the bundle text.
    if not value.isprintable():
        raise ValueError(f"{what} must be printable text on one line (no line breaks or controls)")
    return value


def _utf8(value: str, what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate; send valid Unicode text") from None
    return value


def _utc(value: datetime | None) -> datetime | None:
    """Naive timestamps read as UTC; aware ones are converted, so equal instants compare equal."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _plus_zero(value: float) -> float:
    return value + 0.0  # -0.0 + 0.0 == +0.0: one spelling of zero in the key


class Relation(BaseModel):
    """A typed link from the item that declares it to another item (`target` is its id)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: RelationType = Field(description="How it relates.")
    target: str = Field(min_length=1, max_length=MAX_ID_CHARS, description="Id of the other item.")

    @field_validator("target")
    @classmethod
    def _check_target(cls, value: str) -> str:
        return _one_line(value, "relation target")


class EvidenceItem(BaseModel):
    """One candidate piece of evidence. Every field can change the result, so all are hashed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS, description="Unique id.")
    text: str = Field(max_length=MAX_TEXT_CHARS, description="Shown verbatim.")
    kind: str = Field(
        "evidence",
        min_length=1,
        max_length=MAX_KIND_CHARS,
        description="claim, observation, document, ...",
    )
    source_refs: tuple[Annotated[str, Field(min_length=1, max_length=MAX_REF_CHARS)], ...] = Field(
        (), description="Sources, rendered as citations in order."
    )
    confidence: float | None = Field(
        None, ge=0, le=1, description="How much its producer trusts it; null = unknown."
    )
    observed_at: datetime | None = Field(None, description="Freshness decays from here to as_of.")
    relevance: float | None = Field(
        None, ge=0, le=1, description="Your relevance score; null = score lexically."
    )
    relations: tuple[Relation, ...] = Field((), description="Typed links to other items.")

    @field_validator("id", "kind")
    @classmethod
    def _check_line(cls, value: str) -> str:
        return _one_line(value, "id and kind")

    @field_validator("source_refs")
    @classmethod
    def _check_refs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_one_line(ref, "each source ref") for ref in value)

    @field_validator("text")
    @classmethod
    def _check_text(cls, value: str) -> str:
        return _utf8(value, "text")

    @field_validator("confidence", "relevance")
    @classmethod
    def _check_unit(cls, value: float | None) -> float | None:
        return None if value is None else _plus_zero(value)

    @field_validator("observed_at")
    @classmethod
    def _check_observed(cls, value: datetime | None) -> datetime | None:
        return _utc(value)

    @field_validator("relations")
    @classmethod
    def _sort_relations(cls, value: tuple[Relation, ...]) -> tuple[Relation, ...]:
        # Declared order never shows in the output; sorting makes equal sets hash equally.
        return tuple(sorted(set(value), key=lambda r: (r.type, r.target)))


class ScoreWeights(BaseModel):
    """Weights of the composite score; they are normalized by their sum."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    relevance: float = Field(0.6, ge=0, le=1000, allow_inf_nan=False, description="Query match.")
    evidence: float = Field(0.25, ge=0, le=1000, allow_inf_nan=False, description="Support.")
    freshness: float = Field(0.15, ge=0, le=1000, allow_inf_nan=False, description="Recency.")

    @field_validator("relevance", "evidence", "freshness")
    @classmethod
    def _zero(cls, value: float) -> float:
        return _plus_zero(value)

    @model_validator(mode="after")
    def _some_weight(self) -> Self:
        if self.relevance + self.evidence + self.freshness <= 0:
            raise ValueError("at least one score weight must be above 0")
        return self


PolicyVersion = Annotated[str, Field(min_length=1, max_length=128)]
TokenBudget = Annotated[int, Field(ge=1, le=1_000_000)]
TopK = Annotated[int, Field(ge=1, le=MAX_ITEMS)]
DiversityLambda = Annotated[float, Field(ge=0, le=1)]
HalfLifeDays = Annotated[float, Field(gt=0, le=1_000_000, allow_inf_nan=False)]
Query = Annotated[str, Field(max_length=20_000)]
ChatAnswerTokens = Annotated[int, Field(ge=1, le=8192)]
"""The bounds of a compile's parameters, declared once: `BundleParams`, bundle_compile and
`bundle compile`'s flags use these."""


class BundleParams(BaseModel):
    """Everything besides the evidence that changes which items are chosen; all of it is keyed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy_version: PolicyVersion = Field(
        "v1",
        description="Your selection policy's version; bump it to invalidate every cached bundle.",
    )
    token_budget: TokenBudget = Field(2000, description="Most tokens the text may use.")
    top_k: TopK = Field(20, description="Most items to select.")
    diversity_lambda: DiversityLambda = Field(
        0.7, description="MMR trade-off: 1 = score only, 0 = diversity only."
    )
    weights: ScoreWeights = Field(default_factory=ScoreWeights)
    freshness_half_life_days: HalfLifeDays = Field(
        30.0, description="Freshness half-life before as_of, in days."
    )
    as_of: datetime | None = Field(
        None,
        description="The instant freshness is measured at; None = freshness is neutral for all "
        "items (the wall clock is never used, so equal input gives an equal bundle).",
    )

    @field_validator("policy_version")
    @classmethod
    def _check_policy(cls, value: str) -> str:
        return _one_line(value, "policy_version")

    @field_validator("diversity_lambda")
    @classmethod
    def _zero(cls, value: float) -> float:
        return _plus_zero(value)

    @field_validator("as_of")
    @classmethod
    def _check_as_of(cls, value: datetime | None) -> datetime | None:
        return _utc(value)


class BundleRequest(BaseModel):
    """A query, the candidate evidence and the parameters: the whole input of a compile."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    query: Query = Field("", description="What the bundle should answer.")
    items: tuple[EvidenceItem, ...] = Field(max_length=MAX_ITEMS)
    params: BundleParams = Field(default_factory=BundleParams)

    @field_validator("query")
    @classmethod
    def _check_query(cls, value: str) -> str:
        return _utf8(value, "query")

    @field_validator("items")
    @classmethod
    def _unique_ids(cls, value: tuple[EvidenceItem, ...]) -> tuple[EvidenceItem, ...]:
        seen: set[str] = set()
        repeated: set[str] = set()
        for item in value:
            (repeated if item.id in seen else seen).add(item.id)
        if duplicates := sorted(repeated):
            shown = ", ".join(repr(d) for d in duplicates[:5])
            raise ValueError(f"item ids must be unique; repeated: {shown}")
        return value
