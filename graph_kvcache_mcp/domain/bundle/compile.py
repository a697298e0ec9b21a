"""Compile a bundle: score, select with MMR under the budget, draw citations and the proof graph.

Pure and deterministic: equal requests (in any item order) and an equal counter give an equal
bundle. The clock is never read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graph_kvcache_mcp.domain.bundle.compiled import PPM, Bundle, ProofEdge, SelectedItem
from graph_kvcache_mcp.domain.bundle.key import bundle_key
from graph_kvcache_mcp.domain.bundle.models import BundleRequest, EvidenceItem
from graph_kvcache_mcp.domain.bundle.render import (
    FIXED_PARTS,
    citation_part,
    edge_part,
    item_part,
)
from graph_kvcache_mcp.domain.bundle.scoring import Scores, score_pool, terms
from graph_kvcache_mcp.domain.bundle.select import Candidate, Edge, select
from graph_kvcache_mcp.domain.bundle.tokens import EstimateCounter, TokenCounter


def declared_edges(items: Sequence[EvidenceItem]) -> frozenset[Edge]:
    """Relations whose two ends are distinct items of the pool."""
    ids = {item.id for item in items}
    return frozenset(
        (item.id, relation.type, relation.target)
        for item in items
        for relation in item.relations
        if relation.target in ids and relation.target != item.id
    )


def _drawable_edges(declared: frozenset[Edge]) -> list[Edge]:
    """Every edge line a selection could draw (alternative_to can come out in either direction)."""
    drawable = set(declared)
    drawable.update((b, r, a) for a, r, b in declared if r == "alternative_to")
    return sorted(drawable)


@dataclass(frozen=True, slots=True)
class _Parts:
    """The text parts of every candidate, index-aligned with the items they come from."""

    blocks: list[str]
    citations: list[str]  # "" for an item without sources
    edges: list[Edge]
    edge_lines: list[str]

    def unique(self) -> list[str]:
        return sorted({*FIXED_PARTS, *self.blocks, *filter(None, self.citations), *self.edge_lines})


def _parts(items: Sequence[EvidenceItem]) -> _Parts:
    edges = _drawable_edges(declared_edges(items))
    return _Parts(
        blocks=[item_part(item.id, item.kind, item.text) for item in items],
        citations=[citation_part(i.id, i.source_refs) if i.source_refs else "" for i in items],
        edges=edges,
        edge_lines=[edge_part(*edge) for edge in edges],
    )


def budget_parts(request: BundleRequest) -> list[str]:
    """Every text part a compile of `request` may count: what an exact counter must pre-count."""
    return _parts(request.items).unique()


def _ppm(value: float) -> int:
    return round(value * PPM)


def compile_bundle(
    request: BundleRequest,
    *,
    counter: TokenCounter | None = None,
    secret: bytes | None = None,
) -> Bundle:
    """The bundle for `request`, fitted with `counter` (default: the estimate).

    The steps: score every item, count every text part a selection could use, select with MMR
    under what the fixed parts leave of the budget, then describe the picks.

    Raises:
        LookupError: a pre-counted counter lacks a part of `budget_parts(request)`.
    """
    counter = counter or EstimateCounter()
    params = request.params
    items = sorted(request.items, key=lambda item: item.id)
    item_terms = [terms(item.text) for item in items]
    scores = score_pool(
        request.query,
        items,
        item_terms,
        weights=params.weights,
        as_of=params.as_of,
        half_life_days=params.freshness_half_life_days,
    )
    costs = _Costs.of(_parts(items), counter)
    candidates = [
        Candidate(id=item.id, terms=item_terms[i], score=scores[i].composite, base_tokens=cost)
        for i, (item, cost) in enumerate(zip(items, costs.item_tokens, strict=True))
    ]
    selection = select(
        candidates,
        top_k=params.top_k,
        diversity_lambda=params.diversity_lambda,
        tokens_left=params.token_budget - costs.fixed_tokens,
        declared=declared_edges(items),
        edge_tokens=costs.edge_tokens,
    )
    chosen = {items[pick.index].id for pick in selection.picks}
    return Bundle(
        key=bundle_key(request, token_counter=counter.name, secret=secret),
        policy_version=params.policy_version,
        token_counter=counter.name,
        token_budget=params.token_budget,
        tokens_used=costs.fixed_tokens + selection.tokens,
        candidates=len(items),
        dropped_over_budget=selection.dropped_over_budget,
        dropped_by_top_k=selection.dropped_by_top_k,
        relations_outside=_relations_outside(items, chosen),
        items=tuple(
            _selected(items[pick.index], scores[pick.index], pick.tokens)
            for pick in selection.picks
        ),
        edges=tuple(ProofEdge(source=s, relation=r, target=t) for s, r, t in selection.edges),
    )


@dataclass(frozen=True, slots=True)
class _Costs:
    """Token costs of the parts: the fixed frame, each item (its block and citation), each edge."""

    fixed_tokens: int
    item_tokens: list[int]
    edge_tokens: dict[Edge, int]

    @classmethod
    def of(cls, parts: _Parts, counter: TokenCounter) -> _Costs:
        unique = parts.unique()
        tokens_of = dict(zip(unique, counter.count_many(unique), strict=True))
        tokens_of[""] = 0  # the citation part of an item without sources
        return cls(
            fixed_tokens=sum(tokens_of[part] for part in FIXED_PARTS),
            item_tokens=[
                tokens_of[block] + tokens_of[citation]
                for block, citation in zip(parts.blocks, parts.citations, strict=True)
            ],
            edge_tokens={
                edge: tokens_of[line]
                for edge, line in zip(parts.edges, parts.edge_lines, strict=True)
            },
        )


def _selected(item: EvidenceItem, scores: Scores, tokens: int) -> SelectedItem:
    return SelectedItem(
        id=item.id,
        kind=item.kind,
        text=item.text,
        source_refs=item.source_refs,
        tokens=tokens,
        score_ppm=_ppm(scores.composite),
        relevance_ppm=_ppm(scores.relevance),
        evidence_ppm=_ppm(scores.evidence),
        freshness_ppm=_ppm(scores.freshness),
        relevance_source=scores.relevance_source,
    )


def _relations_outside(items: Sequence[EvidenceItem], chosen: set[str]) -> int:
    """Declared relations with an end outside the selection (not drawn in the proof graph)."""
    return sum(1 for source, _, target in _all_relations(items) if not {source, target} <= chosen)


def _all_relations(items: Sequence[EvidenceItem]) -> list[tuple[str, str, str]]:
    return [(item.id, rel.type, rel.target) for item in items for rel in item.relations]
