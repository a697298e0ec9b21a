"""Event decoding (both encodings) and the block index keyed by token-chain content."""

from __future__ import annotations

from typing import Any

import pytest

from graph_kvcache_mcp.domain.fleet.events import (
    AllCleared,
    BadBatch,
    BlocksRemoved,
    BlocksStored,
    decode_batch,
)
from graph_kvcache_mcp.domain.fleet.index import (
    BlockIndex,
    cacheable_tokens,
    prompt_keys,
)
from tests.support.kv_event_publisher import block_stored

BS = 4
PROMPT = list(range(100, 113))  # 13 tokens: three full blocks of 4 and one token over


def stored_map(
    hashes: list[int], parent: int | None, tokens: list[int], **extra: Any
) -> dict[str, Any]:
    return block_stored(hashes, parent, tokens, block_size=BS, **extra)


def test_the_map_and_the_array_encodings_decode_to_the_same_events() -> None:
    as_map = [
        1.5,
        [
            stored_map([1, 2], None, PROMPT[:8]),
            {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"},
            {"type": "AllBlocksCleared"},
        ],
        0,
    ]
    as_array = [
        1.5,
        [
            ["BlockStored", [1, 2], None, PROMPT[:8], BS, None, "GPU", None],
            ["BlockRemoved", [2], "GPU"],
            ["AllBlocksCleared"],
        ],
        0,
    ]
    one, two = decode_batch(as_map), decode_batch(as_array)
    assert one.events == two.events
    assert one.encodings == {"map"} and two.encodings == {"array"}
    stored, removed, cleared = one.events
    assert isinstance(stored, BlocksStored) and stored.block_hashes == (1, 2)
    assert isinstance(removed, BlocksRemoved) and removed.medium == "GPU"
    assert isinstance(cleared, AllCleared)


def test_unknown_and_malformed_events_are_counted_not_raised() -> None:
    batch = decode_batch([2.0, [{"type": "Future"}, stored_map([1], None, [1, 2]), 7], None])
    assert batch.events == () and batch.undecodable == 3
    with pytest.raises(BadBatch):
        decode_batch({"ts": 1})


def index_with(*events: Any, name: str = "a") -> BlockIndex:
    index = BlockIndex()
    index.apply(name, decode_batch([0.0, list(events), 0]).events)
    return index


def test_a_prompt_matches_the_blocks_an_instance_stored_whatever_their_hashes() -> None:
    # a stores the first two blocks in one event, then the third under its parent's hash
    index = index_with(stored_map([11, 12], None, PROMPT[:8]), stored_map([13], 12, PROMPT[8:12]))
    # b names the same content with other hashes (another hash seed): same keys here
    index.apply("b", decode_batch([0.0, [stored_map([91, 92], None, PROMPT[:8])], 0]).events)
    keys = prompt_keys(PROMPT, BS)
    assert len(keys) == 3
    assert index.match("a", keys, BS).tokens == 12
    assert index.match("b", keys, BS).tokens == 8
    assert index.match("c", keys, BS).tokens == 0
    assert index.match("a", keys, BS).by_medium == {"GPU": 12}


def test_removal_and_clear_take_blocks_away_and_a_gap_stops_the_match() -> None:
    index = index_with(stored_map([11, 12, 13], None, PROMPT[:12]))
    keys = prompt_keys(PROMPT, BS)
    index.apply("a", [BlocksRemoved((12,), "GPU")])
    assert index.match("a", keys, BS).tokens == 4  # vLLM stops at the first missing block
    index.apply("a", [BlocksRemoved((11,), None)])
    assert index.match("a", keys, BS).tokens == 0
    index.apply("a", decode_batch([0.0, [stored_map([11], None, PROMPT[:4])], 0]).events)
    assert index.match("a", keys, BS).tokens == 4
    index.apply("a", [AllCleared()])
    assert index.match("a", keys, BS).tokens == 0 and index.blocks_held("a") == 0


def test_a_block_in_two_media_counts_for_each_until_both_are_gone() -> None:
    index = index_with(
        stored_map([11], None, PROMPT[:4]), stored_map([11], None, PROMPT[:4], medium="CPU")
    )
    keys = prompt_keys(PROMPT, BS)
    assert index.match("a", keys, BS).by_medium == {"GPU": 4, "CPU": 4}
    index.apply("a", [BlocksRemoved((11,), "GPU")])
    assert index.match("a", keys, BS).by_medium == {"CPU": 4}


def test_salted_or_lora_blocks_never_match_a_plain_prompt() -> None:
    index = index_with(
        stored_map([11], None, PROMPT[:4], extra_keys=[["salt"]]),
        stored_map([21], None, PROMPT[:4], lora_name="x"),
        name="a",
    )
    assert index.match("a", prompt_keys(PROMPT, BS), BS).tokens == 0


def test_a_block_whose_parent_was_never_seen_is_an_orphan() -> None:
    index = index_with(stored_map([13], 12, PROMPT[8:12]))
    assert index.counts["a"].orphans == 1 and len(index) == 0


def test_memory_is_bounded_and_forgetting_is_counted() -> None:
    index = BlockIndex(max_blocks=2)
    index.apply("a", decode_batch([0.0, [stored_map([11, 12, 13], None, PROMPT[:12])], 0]).events)
    assert len(index) == 2 and index.forgotten == 1
    assert index.match("a", prompt_keys(PROMPT, BS), BS).tokens == 0  # the root was forgotten


def test_the_listing_spells_the_longest_chains_from_the_root_with_their_holders() -> None:
    index = index_with(stored_map([11, 12, 13], None, PROMPT[:12]))
    index.apply("b", decode_batch([0.0, [stored_map([91], None, PROMPT[:4])], 0]).events)
    (chain, holders), *rest = index.leaves(5)
    assert [t for block in chain for t in block] == PROMPT[:12]
    assert holders == {"a": {"GPU"}}
    assert rest == []  # b's block is a prefix of a's chain, not a tip


@pytest.mark.parametrize(("tokens", "expected"), [(13, 12), (12, 8), (4, 0), (5, 4), (0, 0)])
def test_vllm_never_serves_the_last_prompt_token_from_cache(tokens: int, expected: int) -> None:
    assert cacheable_tokens(tokens, BS) == expected
