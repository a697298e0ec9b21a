"""The block index on a hybrid model: every KV cache group tracked, a hit only where every group
can serve. The events have the shape CPU vLLM 0.32 publishes for a tiny GraniteMoeHybrid
(measured): per step one `BlockStored` per group, the mamba group's first, carrying the step's
tokens and no hash, except on the step that keeps the state, where its one hash is the attention
group's hash at that position."""

from __future__ import annotations

from typing import Any

import pytest

from graph_kvcache_mcp.domain.fleet.events import AllCleared, BlocksRemoved, decode_batch
from graph_kvcache_mcp.domain.fleet.index import BlockIndex, prompt_keys
from graph_kvcache_mcp.domain.fleet.kv_groups import groups_gap
from graph_kvcache_mcp.domain.vllm.hybrid.cache import (
    hybrid_cached_tokens,
    is_hybrid_cache,
    is_hybrid_config,
    keeps_state_at_prefill_end_only,
    state_position,
)
from tests.support.kv_event_publisher import block_stored

BS = 4
PROMPT = list(range(100, 123))  # 23 tokens: five full blocks of 4, three tokens over


def step(
    block: int, hash_base: int, *, keep_state: bool, mamba_groups: tuple[int, ...] = (0,)
) -> list[dict[str, Any]]:
    """The events of the prefill step that computes `block` (one block per step): each mamba
    group's, then the attention group's (the last group)."""
    tokens = PROMPT[block * BS : (block + 1) * BS]
    name = hash_base + block
    parent = None if block == 0 else name - 1
    events = [
        block_stored(
            [name] if keep_state else [],
            parent,
            tokens,
            block_size=BS,
            group_idx=group,
            kv_cache_spec_kind="mamba",
        )
        for group in mamba_groups
    ]
    attention = len(mamba_groups)
    events.append(
        block_stored(
            [name],
            parent,
            tokens,
            block_size=BS,
            group_idx=attention,
            kv_cache_spec_kind="full_attention",
        )
    )
    return events


def prefill(
    index: BlockIndex, blocks: int, *, hash_base: int = 1000, mamba_groups: tuple[int, ...] = (0,)
) -> None:
    """A request whose prefill covers `blocks` full blocks: the state kept at the last one."""
    for block in range(blocks):
        events = step(block, hash_base, keep_state=block == blocks - 1, mamba_groups=mamba_groups)
        index.apply("a", decode_batch([float(block), events, 0]).events)


def test_mamba_events_without_hashes_decode_and_name_their_group() -> None:
    batch = decode_batch([0.0, step(0, 1000, keep_state=False), 0])
    assert batch.undecodable == 0
    mamba, attention = batch.events
    assert (mamba.group_idx, mamba.kv_cache_spec_kind, mamba.block_hashes) == (0, "mamba", ())  # type: ignore[union-attr]
    assert attention.kv_cache_spec_kind == "full_attention"  # type: ignore[union-attr]


@pytest.mark.parametrize("mamba_groups", [(0,), (0, 1)])
def test_a_hybrid_serves_only_up_to_where_every_mamba_group_kept_a_state(
    mamba_groups: tuple[int, ...],
) -> None:
    index = BlockIndex()
    prefill(index, 5, mamba_groups=mamba_groups)  # a 23-token prompt: state at block 5
    keys = prompt_keys(PROMPT, BS)
    held = index.match("a", keys, BS)
    assert (held.tokens, held.state_blocks) == (20, (5,))
    assert held.served_tokens(23, BS) == 20 and held.usable_tokens(BS) == 20
    # a prompt sharing only the first 15 tokens: attention holds 3 blocks, no state there
    shared_head = index.match("a", prompt_keys([*PROMPT[:15], 1, 2, 3, 4, 5], BS), BS)
    assert shared_head.tokens == 12 and shared_head.served_tokens(20, BS) == 0
    # an exact repeat of a 20-token prompt can reuse at most 16 tokens: no state there either
    assert index.match("a", keys[:5], BS).served_tokens(20, BS) == 0
    assert groups_gap(index.groups("a"), hybrid=True) is None


def test_a_request_ending_on_the_shared_head_makes_it_reusable() -> None:
    index = BlockIndex()
    prefill(index, 5)
    prefill(index, 3, hash_base=1000)  # a warm-up on the first 12 tokens: a state at block 3
    edited = [*PROMPT[:13], *[0] * 10]
    assert index.match("a", prompt_keys(edited, BS), BS).served_tokens(23, BS) == 12


def test_a_removed_state_or_a_cleared_cache_takes_the_hit_away_per_group() -> None:
    index = BlockIndex()
    prefill(index, 5, mamba_groups=(0, 1))
    keys = prompt_keys(PROMPT, BS)
    index.apply("a", [BlocksRemoved((1004,), "GPU", group_idx=1)])
    held = index.match("a", keys, BS)
    assert held.tokens == 20 and held.served_tokens(23, BS) == 0  # attention still holds it
    prefill(index, 5, mamba_groups=(0, 1))
    assert index.match("a", keys, BS).served_tokens(23, BS) == 20
    index.apply("a", [AllCleared()])
    assert index.match("a", keys, BS).served_tokens(23, BS) == 0
    assert index.groups("a") == {0: "mamba", 1: "mamba", 2: "full_attention"}  # still known
    index.forget_instance("a")  # a restart: the new process may serve another model
    assert index.groups("a") == {}


def test_a_dense_model_naming_its_one_group_matches_as_before() -> None:
    index = BlockIndex()
    tokens = PROMPT[:12]
    event = block_stored(
        [1, 2, 3], None, tokens, block_size=BS, group_idx=0, kv_cache_spec_kind="full_attention"
    )
    index.apply("a", decode_batch([0.0, [event], 0]).events)
    held = index.match("a", prompt_keys(PROMPT, BS), BS)
    assert (held.tokens, held.state_blocks, held.served_tokens(23, BS)) == (12, None, 12)
    assert groups_gap(index.groups("a"), hybrid=False) is None


def test_groups_not_yet_seen_or_not_modelled_make_the_prediction_a_guess() -> None:
    assert groups_gap({}, hybrid=None) is None  # a dense vLLM that names no group
    assert "no event" in (groups_gap({}, hybrid=True) or "")
    assert "[1]" in (groups_gap({0: "mamba", 2: "full_attention"}, hybrid=True) or "")
    assert "not modelled" in (
        groups_gap({0: "sliding_window", 1: "full_attention"}, hybrid=None) or ""
    )
    assert "no attention" in (groups_gap({0: "mamba"}, hybrid=True) or "")


def test_the_cache_config_labels_say_whether_a_model_keeps_mamba_state() -> None:
    assert is_hybrid_cache({"mamba_block_size": "32", "mamba_cache_mode": "align"}) is True
    assert is_hybrid_cache({"mamba_block_size": "None", "mamba_cache_mode": "none"}) is False
    assert is_hybrid_cache({"block_size": "32"}) is None
    assert keeps_state_at_prefill_end_only({"mamba_block_size": "32", "mamba_cache_mode": "align"})
    assert not keeps_state_at_prefill_end_only(
        {"mamba_block_size": "32", "mamba_cache_mode": "all"}
    )
    assert not keeps_state_at_prefill_end_only({"mamba_block_size": "None"})


@pytest.mark.parametrize(
    ("first", "common", "second", "expected"),
    [
        (3384, 3384, 3384, 3360),  # exact repeat: the state at the last full block
        (3384, 1349, 3387, 0),  # an edit inside the cached prompt: no state before it
        (1643, 1643, 3387, 1632),  # the second extends the first: its state is reused
        (224, 224, 224, 192),  # whole blocks: the state before the last token (measured)
        (224, 192, 192, 0),  # a prefix of whole blocks: resuming at 192 needs the last token
        (20, 0, 20, 0),
    ],
)
def test_a_hybrid_serves_the_first_requests_kept_state_or_nothing(
    first: int, common: int, second: int, expected: int
) -> None:
    assert hybrid_cached_tokens(first, common, second, 32) == expected
    assert state_position(first, 32) == (first - 1) // 32 * 32


@pytest.mark.parametrize(
    ("config", "hybrid"),
    [
        ({"layer_types": ["mamba", "attention", "mamba", "attention"]}, True),  # Granite-4.0-H
        ({"layers_block_type": ["mamba", "attention"]}, True),  # NemotronH
        ({"layer_types": ["linear_attention", "full_attention"]}, True),  # Qwen3-Next
        ({"hybrid_override_pattern": "M-M*"}, True),  # older NemotronH
        ({"model_type": "falcon_h1", "mamba_d_state": 16}, True),
        ({"layer_types": ["sliding_attention", "full_attention"]}, False),  # Gemma 3
        ({"model_type": "llama", "num_hidden_layers": 2}, False),
    ],
)
def test_a_models_config_says_whether_it_keeps_recurrent_state(
    config: dict[str, Any], hybrid: bool
) -> None:
    assert is_hybrid_config(config) is hybrid
