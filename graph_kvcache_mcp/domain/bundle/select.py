"""Which candidates make the bundle: MMR diversity selection under a token budget. Pure.

Maximal marginal relevance picks, one at a time, the candidate with the best
`lambda * score - (1 - lambda) * (highest similarity to anything already chosen)`; similarity is the
Jaccard overlap of word sets. A pick that does not fit the tokens left is skipped (and counted),
and the next best is tried, so a smaller item can still fill the gap. Ties go to the smaller id,
so the result never depends on input order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from graph_kvcache_mcp.domain.bundle.models import RELATION_TYPES, RelationType

Edge = tuple[str, RelationType, str]


@dataclass(frozen=True, slots=True)
class Candidate:
    id: str
    terms: frozenset[str]
    score: float
    base_tokens: int
    """Tokens of the item's block plus its citation line (edges are added when chosen)."""


@dataclass(frozen=True, slots=True)
class Pick:
    index: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Selection:
    picks: tuple[Pick, ...]
    edges: tuple[Edge, ...]
    dropped_over_budget: int
    dropped_by_top_k: int
    tokens: int


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 0.0
    return len(a & b) / len(a | b)


def new_edges(chosen_id: str, earlier_ids: Sequence[str], declared: frozenset[Edge]) -> list[Edge]:
    """Edges between a newly chosen item and those chosen before it, in a fixed order.

    alternative_to is symmetric: drawn once, from the earlier item to the later one.
    """
    edges: list[Edge] = []
    for earlier in earlier_ids:
        for relation in RELATION_TYPES:
            forward = (chosen_id, relation, earlier) in declared
            backward = (earlier, relation, chosen_id) in declared
            if relation == "alternative_to":
                if forward or backward:
                    edges.append((earlier, relation, chosen_id))
                continue
            if forward:
                edges.append((chosen_id, relation, earlier))
            if backward:
                edges.append((earlier, relation, chosen_id))
    return edges


def select(
    candidates: Sequence[Candidate],
    *,
    top_k: int,
    diversity_lambda: float,
    tokens_left: int,
    declared: frozenset[Edge],
    edge_tokens: Mapping[Edge, int],
) -> Selection:
    """Run MMR with the budget fit. `candidates` must be sorted by id (ties go to the first)."""
    remaining = list(range(len(candidates)))
    max_similarity = [0.0] * len(candidates)
    picks: list[Pick] = []
    chosen_ids: list[str] = []
    edges: list[Edge] = []
    over_budget = 0
    used = 0
    lam = diversity_lambda

    def mmr(index: int) -> tuple[float, int]:
        value = lam * candidates[index].score - (1.0 - lam) * max_similarity[index]
        return value, -index  # equal value: the smaller index (smaller id) wins

    while remaining and len(picks) < top_k:
        if tokens_left - used < min(candidates[i].base_tokens for i in remaining):
            over_budget += len(remaining)  # nothing left can fit: stop scanning
            remaining = []
            break
        best = max(remaining, key=mmr)
        remaining.remove(best)
        candidate = candidates[best]
        added = new_edges(candidate.id, chosen_ids, declared)
        cost = candidate.base_tokens + sum(edge_tokens[edge] for edge in added)
        if cost > tokens_left - used:
            over_budget += 1
            continue
        used += cost
        picks.append(Pick(best, cost))
        chosen_ids.append(candidate.id)
        edges += added
        if lam < 1.0:
            for other in remaining:
                similarity = jaccard(candidate.terms, candidates[other].terms)
                if similarity > max_similarity[other]:
                    max_similarity[other] = similarity
    return Selection(
        picks=tuple(picks),
        edges=tuple(edges),
        dropped_over_budget=over_budget,
        dropped_by_top_k=len(remaining),
        tokens=used,
    )
