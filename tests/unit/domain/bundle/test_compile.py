"""Compile: scoring, MMR diversity, the budget fit, citations and the proof graph."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from graph_kvcache_mcp.domain.bundle import (
    BundleRequest,
    EstimateCounter,
    PrecountedCounter,
    budget_parts,
    compile_bundle,
)
from graph_kvcache_mcp.domain.bundle.render import CITATIONS_HEADING, FIXED_PARTS, PROOF_HEADING
from tests.support.bundles import CharCounter, corpus, item, request


def ids(req: BundleRequest) -> list[str]:
    return [i.id for i in compile_bundle(req).items]


def test_compile_is_deterministic_and_ignores_input_order() -> None:
    items = corpus(60)
    one = compile_bundle(request(items, "prefix cache eviction", top_k=12, token_budget=900))
    two = compile_bundle(
        request(list(reversed(items)), "prefix cache eviction", top_k=12, token_budget=900)
    )
    assert one == two
    assert one.text() == two.text()


def test_tokens_used_is_exactly_the_counted_text_and_within_budget() -> None:
    bundle = compile_bundle(
        request(corpus(40), "block hash", token_budget=1500, top_k=40), counter=CharCounter()
    )
    text = bundle.text()
    unrendered_headings = (0 if bundle.citations else len(CITATIONS_HEADING)) + (
        0 if bundle.edges else len(PROOF_HEADING)
    )
    assert bundle.tokens_used == len(text) + unrendered_headings
    assert bundle.tokens_used <= 1500
    fixed = sum(len(part) for part in FIXED_PARTS)
    assert bundle.tokens_used == fixed + sum(i.tokens for i in bundle.items)


def test_an_item_that_does_not_fit_is_skipped_and_a_smaller_one_fills_the_gap() -> None:
    big = item("big", "prefix " * 200, relevance=1.0)
    small = item("small", "prefix cache", relevance=0.4)
    budget = sum(len(part) for part in FIXED_PARTS) + 50
    bundle = compile_bundle(request([big, small], token_budget=budget), counter=CharCounter())
    assert [i.id for i in bundle.items] == ["small"]
    assert (bundle.dropped_over_budget, bundle.dropped_by_top_k) == (1, 0)


def test_a_budget_below_the_fixed_headings_selects_nothing_and_says_why() -> None:
    bundle = compile_bundle(request(corpus(7), token_budget=5))
    assert bundle.items == ()
    assert (bundle.dropped_over_budget, bundle.candidates) == (7, 7)


def test_top_k_caps_the_selection_and_counts_the_rest() -> None:
    bundle = compile_bundle(request(corpus(25), top_k=4, token_budget=100_000))
    assert len(bundle.items) == 4
    assert (bundle.dropped_by_top_k, bundle.dropped_over_budget) == (21, 0)


def test_lambda_one_ranks_by_score_and_lower_lambda_avoids_near_duplicates() -> None:
    items = [
        item("a", "vllm prefix cache hit rate", relevance=1.0),
        item("a-copy", "vllm prefix cache hit rate again", relevance=0.95),
        item("other", "lmcache offload to disk", relevance=0.6),
    ]
    assert ids(request(items, top_k=2, diversity_lambda=1.0)) == ["a", "a-copy"]
    assert ids(request(items, top_k=2, diversity_lambda=0.3)) == ["a", "other"]


def test_equal_scores_tie_break_on_the_smaller_id() -> None:
    items = [item(name, "same words", relevance=0.5) for name in ("c", "a", "b")]
    assert ids(request(items, diversity_lambda=1.0)) == ["a", "b", "c"]


def test_caller_relevance_wins_over_the_lexical_score() -> None:
    items = [
        item("lexical", "prefix cache prefix cache"),
        item("caller", "unrelated words", relevance=1.0),
    ]
    bundle = compile_bundle(request(items, "prefix cache", weights={"relevance": 1, "evidence": 0}))
    by_id = {i.id: i for i in bundle.items}
    assert by_id["caller"].relevance_source == "caller"
    assert by_id["caller"].relevance_ppm == 1_000_000
    assert by_id["lexical"].relevance_source == "lexical"
    assert by_id["lexical"].relevance_ppm == 1_000_000  # every query word is in the text


def test_lexical_relevance_favours_rare_query_words() -> None:
    items = [
        item("common", "cache cache cache"),
        item("rare", "eviction"),
        item("filler-1", "cache block"),
        item("filler-2", "cache chunk"),
    ]
    bundle = compile_bundle(request(items, "cache eviction", weights={"evidence": 0}))
    by_id = {i.id: i.relevance_ppm for i in bundle.items}
    assert by_id["rare"] > by_id["common"] > 0


def test_freshness_halves_every_half_life_back_from_as_of() -> None:
    as_of = datetime(2025, 6, 30, tzinfo=UTC)
    items = [
        item("new", observed_at=as_of),
        item("one-half-life", observed_at=datetime(2025, 6, 20, tzinfo=UTC)),
        item("future", observed_at=datetime(2026, 1, 1, tzinfo=UTC)),
        item("undated"),
    ]
    bundle = compile_bundle(request(items, as_of=as_of, freshness_half_life_days=10))
    fresh = {i.id: i.freshness_ppm for i in bundle.items}
    assert fresh == {
        "new": 1_000_000,
        "one-half-life": 500_000,
        "future": 1_000_000,
        "undated": 500_000,
    }


def test_without_as_of_freshness_is_neutral_for_every_item() -> None:
    bundle = compile_bundle(request(corpus(6)))
    assert {i.freshness_ppm for i in bundle.items} == {500_000}


def test_evidence_quality_rewards_confidence_and_sources() -> None:
    items = [
        item("sure-sourced", confidence=1.0, source_refs=("a", "b", "c")),
        item("sure", confidence=1.0),
        item("unknown"),
    ]
    quality = {i.id: i.evidence_ppm for i in compile_bundle(request(items)).items}
    assert quality == {"sure-sourced": 1_000_000, "sure": 800_000, "unknown": 400_000}


def test_citations_follow_the_selection_in_order() -> None:
    items = [
        item("a", relevance=1.0, source_refs=("paper-1", "paper-2")),
        item("b", relevance=0.5),
        item("c", relevance=0.8, source_refs=("log-7",)),
    ]
    bundle = compile_bundle(request(items, diversity_lambda=1.0))
    assert [(c.id, c.source_refs) for c in bundle.citations] == [
        ("a", ("paper-1", "paper-2")),
        ("c", ("log-7",)),
    ]
    assert "Citations:\n- [a] paper-1; paper-2\n- [c] log-7\n" in bundle.text()


def test_proof_graph_holds_only_relations_between_selected_items() -> None:
    items = [
        item("a", relevance=1.0, relations=[{"type": "supports", "target": "b"}]),
        item("b", relevance=0.9, relations=[{"type": "alternative_to", "target": "a"}]),
        item("c", relevance=0.8, relations=[{"type": "contradicts", "target": "a"}]),
        item("d", relevance=0.0, relations=[{"type": "supports", "target": "a"}]),
        item("e", relevance=0.7, relations=[{"type": "supports", "target": "nowhere"}]),
    ]
    bundle = compile_bundle(request(items, top_k=4, diversity_lambda=1.0))
    assert [i.id for i in bundle.items] == ["a", "b", "c", "e"]
    edges = [(e.source, e.relation, e.target) for e in bundle.edges]
    assert edges == [
        ("a", "supports", "b"),
        ("a", "alternative_to", "b"),
        ("c", "contradicts", "a"),
    ]
    assert bundle.relations_outside == 2  # d -> a (d not chosen), e -> nowhere (unknown id)
    assert "Proof graph:\n- [a] supports [b]\n- [a] alternative_to [b]\n" in bundle.text()


def test_alternative_to_declared_both_ways_is_drawn_once() -> None:
    items = [
        item("x", relevance=1.0, relations=[{"type": "alternative_to", "target": "y"}]),
        item("y", relevance=0.5, relations=[{"type": "alternative_to", "target": "x"}]),
    ]
    bundle = compile_bundle(request(items, diversity_lambda=1.0))
    assert [(e.source, e.target) for e in bundle.edges] == [("x", "y")]


def test_edge_lines_count_against_the_budget() -> None:
    related = [
        item("a", "alpha", relevance=1.0, relations=[{"type": "supports", "target": "b"}]),
        item("b", "beta", relevance=0.9),
    ]
    plain = [item("a", "alpha", relevance=1.0), item("b", "beta", relevance=0.9)]
    with_edge = compile_bundle(request(related, token_budget=10_000), counter=CharCounter())
    without = compile_bundle(request(plain, token_budget=10_000), counter=CharCounter())
    assert with_edge.tokens_used - without.tokens_used == len("- [a] supports [b]\n")
    assert with_edge.items[1].tokens - without.items[1].tokens == len("- [a] supports [b]\n")


def test_a_precounted_counter_from_budget_parts_gives_the_same_bundle_as_counting_live() -> None:
    req = request(corpus(30), "kv offload", token_budget=700)
    live = EstimateCounter()
    parts = budget_parts(req)
    table = PrecountedCounter(live.name, dict(zip(parts, live.count_many(parts), strict=True)))
    assert compile_bundle(req, counter=table) == compile_bundle(req, counter=live)


def test_a_precounted_counter_missing_a_part_refuses_to_guess() -> None:
    with pytest.raises(LookupError):
        compile_bundle(request(corpus(3)), counter=PrecountedCounter("partial", {}))


def test_the_estimate_counts_utf8_bytes_over_four_rounded_up() -> None:
    assert EstimateCounter().count_many(["", "abcd", "abcde", "é"]) == [0, 1, 2, 1]


def test_duplicate_ids_are_refused_with_the_ids_named() -> None:
    with pytest.raises(ValidationError, match="'dup'"):
        request([item("dup"), item("dup"), item("ok")])


@pytest.mark.parametrize("bad_id", ["line\nbreak", "tab\there", ""])
def test_ids_must_be_one_printable_line(bad_id: str) -> None:
    with pytest.raises(ValidationError):
        item(bad_id)


def test_all_zero_weights_are_refused() -> None:
    with pytest.raises(ValidationError, match="at least one score weight"):
        request(corpus(2), weights={"relevance": 0, "evidence": 0, "freshness": 0})
