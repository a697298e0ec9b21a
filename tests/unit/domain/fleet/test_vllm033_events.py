"""vLLM 0.33's KV events as its own encoder wrote them (`tests/support/record_vllm_events.py`):
lookahead hashing folds the tokens after each block into its key, and MLA groups are indexed as
attention."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack

from graph_kvcache_mcp.domain.fleet.events import BlocksStored, decode_batch
from graph_kvcache_mcp.domain.fleet.index import BlockIndex, prompt_keys
from graph_kvcache_mcp.domain.fleet.kv_groups import groups_gap
from tests.support.record_vllm_events import AHEAD, BLOCK, PROMPT_A, PROMPT_B

RECORDED = Path(__file__).parents[3] / "data" / "kv_events" / "vllm-0.33-lookahead-mla.msgpack"


def recorded_batches() -> list[object]:
    raw, batches = RECORDED.read_bytes(), []
    while raw:
        (size,) = struct.unpack(">I", raw[:4])
        batches.append(msgpack.unpackb(raw[4 : 4 + size]))
        raw = raw[4 + size :]
    return batches


def applied(count: int) -> BlockIndex:
    """The index after the first `count` recorded batches: the first two are the speculative
    instance's, the third the MLA instance's."""
    index = BlockIndex()
    for n, raw in enumerate(recorded_batches()[:count]):
        index.apply("mla" if n == 2 else "spec", decode_batch(raw).events)
    return index


def held(index: BlockIndex, instance: str, tokens: list[int]) -> int:
    keys = prompt_keys(tokens, BLOCK, lookahead=index.lookahead(instance))
    return index.match(instance, keys, BLOCK).tokens


def test_the_lookahead_tokens_are_decoded_per_block() -> None:
    stored = decode_batch(recorded_batches()[0]).events[0]
    assert isinstance(stored, BlocksStored)
    assert stored.lookahead_token_ids == ((104, 105), (108, 109))
    assert applied(1).lookahead("spec") == AHEAD


def test_a_prompt_that_diverges_inside_the_lookahead_is_not_a_hit() -> None:
    index = applied(1)
    assert held(index, "spec", PROMPT_A) == 8  # 13 tokens: blocks end at 4 and 8 (8 + 2 <= 13)
    diverging = [*PROMPT_A[:5], 7, 7, 7, 7, 7, 7, 7, 7]
    # vLLM hashes block 0 with tokens 4-5 too: (104, 7) is not what it stored
    assert held(index, "spec", diverging) == 0
    assert held(index, "spec", PROMPT_B) == 4


def test_removing_one_variant_keeps_the_other_that_shares_its_tokens() -> None:
    index = applied(2)  # hash 11 (A's first block) removed; B's first block holds the same tokens
    assert held(index, "spec", PROMPT_A) == 0
    assert held(index, "spec", PROMPT_B) == 4


def test_the_last_lookahead_tokens_of_a_prompt_end_no_block() -> None:
    assert len(prompt_keys(PROMPT_A, BLOCK, lookahead=AHEAD)) == 2
    assert len(prompt_keys(PROMPT_A, BLOCK)) == 3
    assert prompt_keys(PROMPT_A, BLOCK, lookahead=AHEAD)[0] != prompt_keys(PROMPT_A, BLOCK)[0]


def test_an_mla_instance_holds_its_blocks_and_is_fully_modelled() -> None:
    index = applied(3)
    assert index.lookahead("mla") == 0
    assert held(index, "mla", PROMPT_A) == 12
    assert index.counts["mla"].skipped_groups == 0
    assert groups_gap(index.groups("mla"), hybrid=False) is None


def test_an_unmodelled_kind_still_says_the_prediction_may_be_high() -> None:
    gap = groups_gap({0: "mla_attention", 1: "sliding_window"}, hybrid=False)
    assert gap is not None and "sliding_window" in gap
