"""Rendering: a cached bundle renders byte-identically to a fresh one, and turns share a prefix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.bundle import (
    DEFAULT_PREAMBLE,
    Bundle,
    BundleParams,
    BundleRequest,
    ChatMessage,
    EvidenceItem,
    compile_bundle,
    decode_bundle,
    encode_bundle,
)
from tests.support.bundles import corpus, request

one_line = st.text(
    st.characters(codec="utf-8", categories=("L", "N", "P", "S"), include_characters=" "),
    min_size=1,
)
unit = st.none() | st.floats(0, 1)
instants = st.none() | st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2030, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7)), timezone(timedelta(hours=9))]),
)


@st.composite
def requests(draw: st.DrawFn) -> BundleRequest:
    ids = draw(st.lists(one_line.map(lambda s: s[:40]), min_size=0, max_size=12, unique=True))
    relation = st.fixed_dictionaries(
        {
            "type": st.sampled_from(["supports", "contradicts", "alternative_to"]),
            "target": st.sampled_from(ids) if ids else one_line,
        }
    )
    items = [
        EvidenceItem(
            id=item_id,
            text=draw(st.text(max_size=300)),
            kind=draw(one_line.map(lambda s: s[:20])),
            source_refs=tuple(draw(st.lists(one_line, max_size=3))),
            confidence=draw(unit),
            observed_at=draw(instants),
            relevance=draw(unit),
            relations=tuple(draw(st.lists(relation, max_size=3))),
        )
        for item_id in ids
    ]
    params = BundleParams(
        policy_version=draw(one_line),
        token_budget=draw(st.integers(1, 3_000)),
        top_k=draw(st.integers(1, 15)),
        diversity_lambda=draw(st.floats(0, 1)),
        weights={
            "relevance": draw(st.floats(0.01, 5)),
            "evidence": draw(st.floats(0, 5)),
            "freshness": draw(st.floats(0, 5)),
        },
        freshness_half_life_days=draw(st.floats(0.01, 1_000)),
        as_of=draw(instants),
    )
    return BundleRequest(query=draw(st.text(max_size=80)), items=tuple(items), params=params)


def round_trip(bundle: Bundle) -> Bundle:
    decoded = decode_bundle(encode_bundle(bundle), expected_key=bundle.key)
    assert isinstance(decoded, Bundle), decoded
    return decoded


def wire(messages: list[ChatMessage]) -> list[bytes]:
    return [f"{m.role}\x00{m.content}".encode() for m in messages]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.text(max_size=100), st.text(max_size=100))
def test_a_cached_bundle_renders_byte_for_byte_like_a_fresh_one(
    req: BundleRequest, preamble: str, turn: str
) -> None:
    fresh = compile_bundle(req)
    cached = round_trip(fresh)
    assert cached.text().encode() == fresh.text().encode()
    fresh_messages = fresh.as_prompt_messages(turn, system_preamble=preamble)
    assert wire(cached.as_prompt_messages(turn, system_preamble=preamble)) == wire(fresh_messages)


@settings(max_examples=40, deadline=None)
@given(requests(), st.text(max_size=50), st.text(max_size=50))
def test_two_turns_share_an_identical_system_message(
    req: BundleRequest, first: str, second: str
) -> None:
    bundle = compile_bundle(req)
    one = bundle.as_prompt_messages(first)
    two = round_trip(bundle).as_prompt_messages(second)
    assert one[0].content.encode() == two[0].content.encode()
    assert (one[-1].content, two[-1].content) == (first, second)


def test_scores_and_token_counts_never_reach_the_text() -> None:
    bundle = compile_bundle(request(corpus(12), "eviction", as_of="2025-09-01T00:00:00Z"))
    rescored = bundle.model_copy(
        update={
            "items": tuple(
                i.model_copy(update={"score_ppm": 1, "freshness_ppm": 2, "tokens": 3})
                for i in bundle.items
            ),
            "tokens_used": 4,
        }
    )
    assert rescored.text() == bundle.text()
    assert "0." not in bundle.text()


def test_the_system_message_is_preamble_blank_line_then_bundle_text() -> None:
    bundle = compile_bundle(request(corpus(3)))
    system, user = bundle.as_prompt_messages("What is cached?")
    assert system.role == "system"
    assert system.content == DEFAULT_PREAMBLE + "\n\n" + bundle.text()
    assert (user.role, user.content) == ("user", "What is cached?")
    assert bundle.as_prompt_messages("q", system_preamble="")[0].content == bundle.text()


def test_history_goes_between_the_system_message_and_the_turn() -> None:
    bundle = compile_bundle(request(corpus(3)))
    history = [
        ChatMessage(role="user", content="first question"),
        ChatMessage(role="assistant", content="first answer"),
    ]
    messages = bundle.as_prompt_messages("second question", history=history)
    assert [m.role for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0] == bundle.as_prompt_messages("other")[0]


def test_history_may_not_hold_a_system_message() -> None:
    bundle = compile_bundle(request(corpus(1)))
    with pytest.raises(ValueError, match="only user and assistant"):
        bundle.as_prompt_messages("q", history=[ChatMessage(role="system", content="x")])


def test_the_text_lays_out_items_citations_and_proof_graph() -> None:
    items = [
        EvidenceItem(
            id="a",
            text="Block size is 16.",
            kind="claim",
            relevance=1.0,
            source_refs=("vllm docs",),
            relations=({"type": "supports", "target": "b"},),
        ),
        EvidenceItem(id="b", text="Hits are whole blocks.", kind="observation", relevance=0.5),
    ]
    bundle = compile_bundle(request(items, diversity_lambda=1.0))
    assert bundle.text() == (
        "Evidence bundle (most relevant first; cite items by [id]).\n"
        "\n[a] (claim)\nBlock size is 16.\n"
        "\n[b] (observation)\nHits are whole blocks.\n"
        "\nCitations:\n- [a] vllm docs\n"
        "\nProof graph:\n- [a] supports [b]\n"
    )
