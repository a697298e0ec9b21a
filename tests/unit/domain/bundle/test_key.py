"""The bundle cache key: stable for equal content, different for any change that matters."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from graph_kvcache_mcp.domain.bundle import (
    BundleParams,
    BundleRequest,
    EstimateCounter,
    EvidenceItem,
    ScoreWeights,
    bundle_key,
)
from graph_kvcache_mcp.domain.engine.keys import check_key
from tests.support.bundles import corpus, item, request

COUNTER = EstimateCounter.name


def key_of(req: BundleRequest, **kwargs: Any) -> str:
    return bundle_key(req, token_counter=kwargs.pop("token_counter", COUNTER), **kwargs)


def test_key_is_the_prefix_and_a_sha256_hex_digest_the_engine_accepts() -> None:
    key = key_of(request(corpus(5), "prefix cache"))
    assert re.fullmatch(r"ctxbundle:[0-9a-f]{64}", key)
    assert check_key(key) == key


def test_key_does_not_depend_on_item_order() -> None:
    items = corpus(30)
    assert key_of(request(items, "q")) == key_of(request(list(reversed(items)), "q"))
    assert key_of(request(items, "q")) == key_of(request(items[15:] + items[:15], "q"))


def test_key_is_equal_for_equal_content_built_separately() -> None:
    one = request(corpus(10), "eviction", token_budget=500)
    two = request(corpus(10), "eviction", token_budget=500)
    assert one is not two
    assert key_of(one) == key_of(two)


def test_key_treats_equal_instants_and_relation_orders_as_equal_content() -> None:
    utc = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    plus_two = utc.astimezone(timezone(timedelta(hours=2)))
    relations: list[dict[str, str]] = [
        {"type": "supports", "target": "b"},
        {"type": "contradicts", "target": "c"},
    ]
    one = item("a", observed_at=utc, relations=relations)
    two = item("a", observed_at=plus_two, relations=list(reversed(relations)))
    others = [item("b"), item("c")]
    as_of_utc = request([one, *others], as_of=utc)
    as_of_shifted = request([two, *others], as_of=plus_two)
    assert key_of(as_of_utc) == key_of(as_of_shifted)


def test_one_character_of_one_items_text_changes_the_key() -> None:
    items = corpus(50)
    edited = items.copy()
    edited[23] = items[23].model_copy(update={"text": items[23].text[:-1] + "?"})
    assert key_of(request(items, "q")) != key_of(request(edited, "q"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("text", "evidence b!"),
        ("kind", "claim"),
        ("source_refs", ("doc-1",)),
        ("confidence", 0.9),
        ("observed_at", datetime(2025, 1, 1, tzinfo=UTC)),
        ("relevance", 0.5),
        ("relations", ({"type": "supports", "target": "a"},)),
    ],
)
def test_every_item_field_changes_the_key(field: str, value: object) -> None:
    base = [item("a"), item("b")]
    changed = [base[0], EvidenceItem.model_validate({**base[1].model_dump(), field: value})]
    assert key_of(request(base)) != key_of(request(changed))


def test_renaming_an_item_changes_the_key() -> None:
    assert key_of(request([item("a", "same text")])) != key_of(request([item("b", "same text")]))


def test_adding_or_removing_a_candidate_changes_the_key() -> None:
    items = corpus(8)
    assert key_of(request(items)) != key_of(request(items[:-1]))


CHANGED_PARAMS: dict[str, object] = {
    "policy_version": "v2",
    "token_budget": 1999,
    "top_k": 21,
    "diversity_lambda": 0.71,
    "weights": ScoreWeights(relevance=0.5),
    "freshness_half_life_days": 29.5,
    "as_of": datetime(2025, 6, 1, tzinfo=UTC),
}


def test_the_parameter_table_covers_every_parameter() -> None:
    assert set(CHANGED_PARAMS) == set(BundleParams.model_fields)


@pytest.mark.parametrize(("field", "value"), sorted(CHANGED_PARAMS.items()))
def test_every_parameter_changes_the_key(field: str, value: object) -> None:
    base = request(corpus(5), "q")
    changed = base.model_copy(update={"params": base.params.model_copy(update={field: value})})
    assert key_of(base) != key_of(changed)


def test_each_weight_changes_the_key() -> None:
    keys = {
        key_of(request(corpus(3), weights=ScoreWeights(**{name: 0.33})))
        for name in ("relevance", "evidence", "freshness")
    }
    assert len(keys | {key_of(request(corpus(3)))}) == 4


def test_query_token_counter_and_secret_change_the_key() -> None:
    base = request(corpus(5), "prefix cache")
    keys = {
        key_of(base),
        key_of(request(corpus(5), "prefix caches")),
        key_of(base, token_counter="vllm-tokenize/tiny-llama"),
        key_of(base, secret=b"s3cret"),
        key_of(base, secret=b"s3cret!"),
    }
    assert len(keys) == 5


def test_equal_parameters_spelled_differently_give_one_key() -> None:
    one = request(corpus(4), diversity_lambda=0.0, weights={"relevance": 1, "evidence": 0})
    two = request(corpus(4), diversity_lambda=-0.0, weights={"relevance": 1.0, "evidence": 0.0})
    assert key_of(one) == key_of(two)
