from __future__ import annotations

from graph_kvcache_mcp.domain.vllm.kv_blocks import block_keys
from graph_kvcache_mcp.domain.vllm.kv_plan import ScheduledRequest, TransferPlanner

DIGEST = "ab" * 32
BLOCK = 4


def _planner() -> TransferPlanner:
    return TransferPlanner(DIGEST, BLOCK)


def _new(req_id: str, computed: int, scheduled: int, blocks: list[int]) -> ScheduledRequest:
    return ScheduledRequest(req_id, computed, scheduled, blocks, replaces_blocks=True)


def test_a_lookup_covers_whole_blocks_after_the_local_hit_and_never_the_last_token() -> None:
    tokens = list(range(16))  # exactly four blocks: the last token's block is left to compute
    keys = _planner().lookup_keys("r", tokens, local_tokens=4, cache_salt=None)
    assert keys == block_keys(DIGEST, tokens, BLOCK)[1:3]


def test_an_admitted_external_hit_becomes_one_load_into_the_blocks_after_the_local_ones() -> None:
    planner, tokens = _planner(), list(range(18))
    planner.lookup_keys("r", tokens, local_tokens=4, cache_salt=None)
    planner.admitted("r", [10, 11, 12, 13, 14], external_tokens=8, local_tokens=4)
    plan = planner.plan_step([_new("r", 12, 6, [10, 11, 12, 13, 14])])
    assert [(load.block_ids, load.keys) for load in plan.loads] == [
        ([11, 12], block_keys(DIGEST, tokens, BLOCK)[1:3])
    ]
    again = planner.plan_step([ScheduledRequest("r", 18, 1)])
    assert again.loads == []


def test_blocks_are_saved_as_chunked_prefill_fills_them_and_never_twice() -> None:
    planner, tokens = _planner(), list(range(14))
    keys = block_keys(DIGEST, tokens, BLOCK)
    planner.lookup_keys("r", tokens, local_tokens=0, cache_salt=None)
    planner.admitted("r", [5, 6], external_tokens=0, local_tokens=0)
    first = planner.plan_step([_new("r", 0, 6, [5, 6])])  # first chunk: 6 tokens, 1 full block
    second = planner.plan_step([ScheduledRequest("r", 6, 8, [7, 8])])  # rest: 14 tokens
    third = planner.plan_step([ScheduledRequest("r", 14, 1)])  # a decode step, no new full block
    assert [(s.block_ids, s.keys) for s in first.saves] == [([5], keys[:1])]
    assert [(s.block_ids, s.keys) for s in second.saves] == [([6, 7], keys[1:3])]
    assert third.saves == []


def test_generated_tokens_that_fill_a_block_are_saved_too() -> None:
    planner, tokens = _planner(), list(range(6))
    planner.lookup_keys("r", tokens, local_tokens=0, cache_salt=None)
    planner.admitted("r", [1, 2], external_tokens=0, local_tokens=0)
    planner.plan_step([_new("r", 0, 6, [1, 2])])
    tokens += [90, 91]  # vLLM appends outputs to the same list the planner holds
    plan = planner.plan_step([ScheduledRequest("r", 7, 1)])
    assert [(s.block_ids, s.keys) for s in plan.saves] == [
        ([2], block_keys(DIGEST, tokens, BLOCK)[1:2])
    ]


def test_loaded_and_locally_cached_blocks_are_not_saved_again() -> None:
    planner, tokens = _planner(), list(range(13))
    planner.lookup_keys("r", tokens, local_tokens=4, cache_salt=None)
    planner.admitted("r", [1, 2, 3, 4], external_tokens=8, local_tokens=4)
    plan = planner.plan_step([_new("r", 12, 1, [1, 2, 3, 4])])
    assert plan.saves == []


def test_a_resumed_request_saves_into_its_new_blocks_without_repeating_saved_ones() -> None:
    planner, tokens = _planner(), list(range(10))
    planner.lookup_keys("r", tokens, local_tokens=0, cache_salt=None)
    planner.admitted("r", [1, 2, 3], external_tokens=0, local_tokens=0)
    planner.plan_step([_new("r", 0, 4, [1, 2, 3])])  # block 0 saved
    planner.plan_step([], preempted=["r"])
    planner.lookup_keys("r", tokens, local_tokens=0, cache_salt=None)
    planner.admitted("r", [7, 8, 9], external_tokens=0, local_tokens=0)
    resumed = ScheduledRequest("r", 0, 10, [7, 8, 9], replaces_blocks=True)
    plan = planner.plan_step([resumed])
    assert [(s.block_ids, s.keys) for s in plan.saves] == [
        ([8], block_keys(DIGEST, tokens, BLOCK)[1:2])
    ]


def test_finished_requests_are_forgotten() -> None:
    planner = _planner()
    planner.lookup_keys("a", list(range(9)), local_tokens=0, cache_salt=None)
    planner.lookup_keys("b", list(range(9)), local_tokens=0, cache_salt=None)
    planner.plan_step([], finished=["a"])
    planner.forget("b")
    assert planner.tracked_requests == 0


def test_requests_the_planner_never_looked_up_are_left_alone() -> None:
    plan = _planner().plan_step([_new("unknown", 0, 8, [1, 2])])
    assert (plan.loads, plan.saves) == ([], [])
