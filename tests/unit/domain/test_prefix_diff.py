"""Prefix-cache miss arithmetic and cause classification (first match wins)."""

from __future__ import annotations

from typing import Any

import pytest

from graph_kvcache_mcp.domain.diagnosis.prefix_diff import (
    CauseKind,
    classify,
    first_different_message,
    first_divergent_token,
    predicted_cached_tokens,
    volatile_at_divergence,
)

SYSTEM = "You review pull requests. Be terse and precise.\n" * 3


def chat(*turns: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in turns]


def kind_of(
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    *,
    common: int = 100,
    block_size: int = 32,
    **extras: Any,
) -> CauseKind:
    return classify(
        first,
        second,
        common=common,
        identical_tokens=first == second and not extras,
        block_size=block_size,
        **extras,
    ).kind


@pytest.mark.parametrize(
    ("common", "second_tokens", "block_size", "cached"),
    [
        (100, 120, 32, 96),
        (96, 120, 32, 96),
        (95, 120, 32, 64),
        (200, 200, 32, 192),  # identical: the last token is always computed
        (192, 193, 32, 192),
        (192, 192, 32, 160),
        (31, 80, 32, 0),
        (0, 1, 16, 0),
    ],
)
def test_predicted_cached_tokens_are_whole_blocks_short_of_the_last_token(
    common: int, second_tokens: int, block_size: int, cached: int
) -> None:
    assert predicted_cached_tokens(common, second_tokens, block_size) == cached


def test_the_first_divergent_token_is_where_the_prompts_part_or_none() -> None:
    assert first_divergent_token([1, 2, 3], [1, 2, 3]) is None
    assert first_divergent_token([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergent_token([1, 2], [1, 2, 3]) == 2


def test_the_first_different_message_counts_an_added_turn() -> None:
    a = chat(("system", "s"), ("user", "u"))
    assert first_different_message(a, a) is None
    assert first_different_message(a, chat(("system", "s"), ("user", "v"))) == 1
    assert first_different_message(a, [*a, {"role": "assistant", "content": "x"}]) == 2


def test_identical_requests_are_identical() -> None:
    a = chat(("system", SYSTEM), ("user", "hi"))
    assert kind_of(a, a) == "identical"


@pytest.mark.parametrize(
    ("before", "after", "volatile"),
    [
        ("Now: 2026-12-01T10:41:07Z.", "Now: 2026-12-01T10:42:19Z.", "timestamp"),
        ("Today is 2026-12-01.", "Today is 2026-12-02.", "date"),
        ("Today is December 1, 2026.", "Today is December 2, 2026.", "date"),
        ("It is 10:41 now.", "It is 10:42 now.", "time"),
        (
            "id 3f2b8c1e-9d4a-4c7b-8e1f-0a2b3c4d5e6f ok",
            "id 7a1c2d3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e ok",
            "UUID",
        ),
        ("nonce: a8Xk2", "nonce: Q7pz1", "nonce"),
        ("commit 9f8e7d6c5b4a done", "commit 1a2b3c4d5e6f done", "hex id"),
        ("Attempt 41 of 50", "Attempt 42 of 50", "counter"),
        ("Request #41 of the day", "Request #42 of the day", "nonce"),
        ("epoch 1764585667 sec", "epoch 1764585999 sec", "timestamp"),
    ],
)
def test_a_volatile_value_at_the_divergence_is_named(
    before: str, after: str, volatile: str
) -> None:
    found = volatile_at_divergence(before, after)
    assert found is not None and found[0] == volatile
    first = chat(("system", before + SYSTEM), ("user", "q"))
    second = chat(("system", after + SYSTEM), ("user", "q"))
    assert kind_of(first, second) == "volatile_value"


def test_an_edit_away_from_any_volatile_value_is_not_volatile() -> None:
    assert volatile_at_divergence("Date 2026-12-01. Be kind.", "Date 2026-12-01. Be firm.") is None
    assert volatile_at_divergence("same", "same") is None


def test_messages_in_another_order_are_reordered() -> None:
    a = chat(("system", SYSTEM), ("user", "doc A"), ("user", "doc B"), ("user", "q"))
    b = chat(("system", SYSTEM), ("user", "doc B"), ("user", "doc A"), ("user", "q"))
    assert kind_of(a, b) == "reordered"


def test_items_of_one_message_in_another_order_are_reordered() -> None:
    a = chat(("system", "tools:\n- grep\n- sed\n- awk\n" + SYSTEM), ("user", "q"))
    b = chat(("system", "tools:\n- awk\n- grep\n- sed\n" + SYSTEM), ("user", "q"))
    assert kind_of(a, b) == "reordered"


def test_texts_that_differ_only_in_whitespace_are_whitespace() -> None:
    a = chat(("system", SYSTEM), ("user", "q"))
    b = chat(("system", SYSTEM.replace("\n", "  \n")), ("user", "q"))
    assert kind_of(a, b) == "whitespace"


def test_a_common_prefix_under_one_block_is_short_prefix() -> None:
    a = chat(("system", "You are a pirate." + SYSTEM), ("user", "q"))
    b = chat(("system", "You are a poet." + SYSTEM), ("user", "q"))
    assert kind_of(a, b, common=5) == "short_prefix"


def test_a_different_last_user_message_is_a_new_turn() -> None:
    a = chat(("system", SYSTEM), ("user", "What does this diff do?"))
    b = chat(("system", SYSTEM), ("user", "Is this diff safe?"))
    assert kind_of(a, b) == "new_turn"
    grown = [*a, {"role": "assistant", "content": "It renames."}, {"role": "user", "content": "ok"}]
    assert kind_of(a, grown) == "new_turn"


def test_an_earlier_message_changed_is_edited() -> None:
    a = chat(("system", SYSTEM + "Prefer tabs."), ("user", "q"))
    b = chat(("system", SYSTEM + "Prefer spaces."), ("user", "q"))
    assert kind_of(a, b) == "edited"
    a = chat(("system", SYSTEM), ("user", "one"), ("assistant", "two"), ("user", "three"))
    b = chat(("system", SYSTEM), ("user", "uno"), ("assistant", "two"), ("user", "three"))
    assert kind_of(a, b) == "edited"


def test_different_tools_with_equal_messages_are_edited() -> None:
    a = chat(("system", SYSTEM), ("user", "q"))
    cause = classify(
        a,
        a,
        common=80,
        identical_tokens=False,
        block_size=32,
        first_extras={"tools": [{"name": "x"}]},
        second_extras={"tools": [{"name": "y"}]},
    )
    assert cause.kind == "edited" and "tools" in cause.detail
