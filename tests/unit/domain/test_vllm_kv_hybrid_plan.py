from __future__ import annotations

import hashlib
import json

import pytest

from graph_kvcache_mcp.domain.vllm.hybrid.kv_plan import HybridPlanner, StateTransfer
from graph_kvcache_mcp.domain.vllm.kv_blocks import (
    KEY_PREFIX,
    block_digests,
    block_keys,
    chain_root,
    state_key,
    unsupported_hybrid,
)
from graph_kvcache_mcp.domain.vllm.kv_plan import ScheduledRequest
from tests.support.kv_identity import kv_identity

DIGEST = "ab" * 32
STATES = "cd" * 32
BLOCK = 4
TOKENS = list(range(100, 118))  # four full blocks and two tokens


def _planner() -> HybridPlanner:
    # vLLM's NemotronH layout: groups 0 and 1 are Mamba, group 2 attention.
    return HybridPlanner(DIGEST, STATES, BLOCK, attention_group=2, state_groups=(0, 1))


def _state(blocks: int, tokens: list[int] = TOKENS) -> str:
    return state_key(STATES, block_digests(chain_root(DIGEST), tokens, BLOCK)[blocks - 1])


def test_state_candidates_name_the_state_at_the_end_of_each_run_longest_first() -> None:
    planner = _planner()
    keys = planner.lookup_keys("r", TOKENS, local_tokens=4, cache_salt=None)
    assert keys == block_keys(DIGEST, TOKENS, BLOCK)[1:4]
    assert planner.state_candidates("r", local_tokens=4, present_blocks=3) == [
        _state(4),
        _state(3),
        _state(2),
    ]


def test_a_state_key_is_never_a_block_key_and_depends_on_the_state_identity() -> None:
    blocks = set(block_keys(DIGEST, TOKENS, BLOCK)) | set(block_keys(STATES, TOKENS, BLOCK))
    states = {_state(n) for n in range(1, 5)}
    assert not blocks & states
    assert all(key.startswith(KEY_PREFIX) for key in states)
    other = state_key("ef" * 32, block_digests(chain_root(DIGEST), TOKENS, BLOCK)[3])
    assert other != _state(4)


def test_an_admitted_hit_loads_its_attention_blocks_and_the_state_into_each_mamba_group() -> None:
    planner = _planner()
    planner.lookup_keys("r", TOKENS, local_tokens=0, cache_salt=None)
    # vLLM's block tables: Mamba groups hold the hit's state in block 3 (null blocks before it).
    tables = ([0, 0, 0, 40, 41], [0, 0, 0, 50, 51], [20, 21, 22, 23, 24])
    planner.admitted("r", tables, external_tokens=16, local_tokens=0)
    plan = planner.plan_step([], offers={})  # loaded before the request is scheduled
    (load,) = plan.loads
    assert (load.blocks.block_ids, load.blocks.keys) == (
        [20, 21, 22, 23],
        block_keys(DIGEST, TOKENS, BLOCK)[:4],
    )
    assert load.state == StateTransfer("r", _state(4), ((40,), (50,)))
    assert planner.plan_step([], offers={}).loads == []


def test_the_states_vllm_offers_are_saved_once_every_mamba_group_offered_one() -> None:
    planner = _planner()
    planner.lookup_keys("r", TOKENS, local_tokens=0, cache_salt=None)
    planner.admitted("r", ([], [], []), external_tokens=0, local_tokens=0)
    step = ScheduledRequest("r", 0, 16, [20, 21, 22, 23], replaces_blocks=True)
    offers = {"r": [(0, 43, 16), (1, 53, 16), (0, 44, 6), (2, 23, 16)], "gone": [(0, 1, 4)]}
    plan = planner.plan_step([step], offers=offers)
    assert plan.state_saves == [StateTransfer("r", _state(4), ((43,), (53,)))]
    assert [save.block_ids for save in plan.saves] == [[20, 21, 22, 23]]
    half = planner.plan_step([ScheduledRequest("r", 16, 1)], offers={"r": [(0, 43, 16)]})
    assert half.state_saves == []


def test_a_request_whose_load_failed_is_not_looked_up_again() -> None:
    planner = _planner()
    planner.load_failed("r")
    assert planner.lookup_keys("r", TOKENS, local_tokens=0, cache_salt=None) == []
    planner.forget("r")
    assert planner.lookup_keys("r", TOKENS, local_tokens=0, cache_salt=None)


HYBRID = {
    "device": "cpu",
    "tensor_parallel": 1,
    "pipeline_parallel": 1,
    "group_kinds": ["MambaSpec", "MambaSpec", "FullAttentionSpec"],
    "sliding_window": False,
    "mamba_cache_mode": "align",
}


def test_a_mamba2_hybrid_in_align_mode_is_handled_on_cpu_and_cuda() -> None:
    assert unsupported_hybrid(**HYBRID) is None  # type: ignore[arg-type]
    assert unsupported_hybrid(**{**HYBRID, "device": "cuda"}) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"mamba_cache_mode": "all"}, "mamba cache mode 'all'"),
        ({"group_kinds": ["FullAttentionSpec", "SlidingWindowSpec"]}, "sliding-window model"),
        ({"sliding_window": True}, "--disable-hybrid-kv-cache-manager"),
        ({"group_kinds": ["MambaSpec", "MLAAttentionSpec"]}, "one full-attention KV cache group"),
        ({"device": "xpu"}, "LMCache's MP connector"),
        ({"tensor_parallel": 2}, "tensor parallelism on CUDA only"),
        ({"device": "cuda", "tensor_parallel": 2}, "a hybrid's blocks for one rank"),
    ],
)
def test_hybrid_setups_the_connector_cannot_move_are_refused_with_the_reason(
    change: dict[str, object], says: str
) -> None:
    problem = unsupported_hybrid(**{**HYBRID, **change})  # type: ignore[arg-type]
    assert problem is not None and says in problem


def test_a_dense_identity_keeps_the_digest_it_had_before_hybrids_and_a_hybrid_one_differs() -> None:
    dense = kv_identity()
    before = {"scheme": 1, **dense.model_dump(exclude={"kv_groups"})}
    canonical = json.dumps(before, sort_keys=True, separators=(",", ":"))
    assert dense.digest == hashlib.sha256(canonical.encode()).hexdigest()
    hybrid = dense.model_copy(update={"kv_groups": '[{"kind":"MambaSpec"}]'})
    assert hybrid.digest != dense.digest
