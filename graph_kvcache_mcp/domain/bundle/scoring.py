"""Scores of one candidate: relevance, evidence quality, freshness, and their weighted mean. Pure.

Every score is in [0, 1]. Nothing here reads the clock: freshness is measured at the request's
`as_of`, and without one it is neutral for every item.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from graph_kvcache_mcp.domain.bundle.models import EvidenceItem, ScoreWeights

NEUTRAL = 0.5
"""Score used when there is nothing to judge by (no confidence, no timestamp or no as_of)."""

CONFIDENCE_SHARE = 0.8
REFS_SHARE = 0.2
REFS_FOR_FULL_CREDIT = 3
SECONDS_PER_DAY = 86_400.0

_WORD = re.compile(r"\w+")


def terms(text: str) -> frozenset[str]:
    """Case-folded word set: the unit of both lexical relevance and MMR similarity."""
    return frozenset(match.casefold() for match in _WORD.findall(text))


@dataclass(frozen=True, slots=True)
class Scores:
    relevance: float
    evidence: float
    freshness: float
    composite: float
    relevance_source: Literal["caller", "lexical"]


def lexical_relevance(
    query_terms: frozenset[str], pool_terms: Sequence[frozenset[str]]
) -> list[float]:
    """Share of the query's idf weight each item covers (0 = no query word, 1 = all of them).

    idf is taken over the candidate pool, so a word every item has counts for little. The result
    does not depend on the pool's order.
    """
    if not query_terms:
        return [0.0] * len(pool_terms)
    size = len(pool_terms)
    idf: dict[str, float] = {}
    for term in query_terms:
        df = sum(term in item for item in pool_terms)
        idf[term] = math.log(1.0 + (size - df + 0.5) / (df + 0.5))
    # fsum is exactly rounded, so set iteration order cannot change a score.
    total = math.fsum(idf.values())
    return [math.fsum(w for t, w in idf.items() if t in item) / total for item in pool_terms]


def evidence_quality(item: EvidenceItem) -> float:
    """Mostly the producer's confidence (neutral when absent), plus credit for up to 3 sources."""
    confidence = NEUTRAL if item.confidence is None else item.confidence
    sourced = min(len(item.source_refs), REFS_FOR_FULL_CREDIT) / REFS_FOR_FULL_CREDIT
    return CONFIDENCE_SHARE * confidence + REFS_SHARE * sourced


def freshness(observed_at: datetime | None, as_of: datetime | None, half_life_days: float) -> float:
    """0.5 ** (age / half-life), age measured back from `as_of`; an item from after `as_of`
    counts as brand new. Neutral without a timestamp or an `as_of`."""
    if observed_at is None or as_of is None:
        return NEUTRAL
    age_days = max(0.0, (as_of - observed_at).total_seconds() / SECONDS_PER_DAY)
    return math.pow(0.5, age_days / half_life_days)


def composite(relevance: float, evidence: float, fresh: float, weights: ScoreWeights) -> float:
    total = weights.relevance + weights.evidence + weights.freshness
    weighted = (
        weights.relevance * relevance + weights.evidence * evidence + weights.freshness * fresh
    )
    return weighted / total


def score_pool(
    query: str,
    items: Sequence[EvidenceItem],
    item_terms: Sequence[frozenset[str]],
    *,
    weights: ScoreWeights,
    as_of: datetime | None,
    half_life_days: float,
) -> list[Scores]:
    """Scores for each item, in input order."""
    lexical = lexical_relevance(terms(query), item_terms)
    scored = []
    for item, lexical_score in zip(items, lexical, strict=True):
        relevance = lexical_score if item.relevance is None else item.relevance
        evidence = evidence_quality(item)
        fresh = freshness(item.observed_at, as_of, half_life_days)
        scored.append(
            Scores(
                relevance=relevance,
                evidence=evidence,
                freshness=fresh,
                composite=composite(relevance, evidence, fresh, weights),
                relevance_source="lexical" if item.relevance is None else "caller",
            )
        )
    return scored
