"""Synthetic evidence: deterministic per seed, and a new seed means new content."""

from __future__ import annotations

from graph_kvcache_mcp.domain.bundle import BundleRequest, compile_bundle
from graph_kvcache_mcp.domain.bundle.synthetic import QUERY, synthetic_evidence


def test_equal_seeds_give_equal_items_and_new_seeds_new_texts() -> None:
    assert synthetic_evidence(50, seed="a") == synthetic_evidence(50, seed="a")
    other = synthetic_evidence(50, seed="b")
    assert all("[b]" in item.text for item in other)
    assert {i.text for i in other}.isdisjoint(i.text for i in synthetic_evidence(50, seed="a"))


def test_synthetic_items_exercise_every_part_of_a_compile() -> None:
    items = synthetic_evidence(200, seed="cover")
    bundle = compile_bundle(BundleRequest(query=QUERY, items=tuple(items)))
    assert len({item.id for item in items}) == 200
    assert bundle.items and bundle.citations and bundle.dropped_by_top_k
    assert any(item.relations for item in items)
    assert {i.relevance_source for i in bundle.items} == {"lexical"}
