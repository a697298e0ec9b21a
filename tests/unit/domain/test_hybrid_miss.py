"""A hybrid's miss explained in hybrid terms: the cause's kind stays, the detail says where the
first request's state is, the fix says how to make the prefix reusable."""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.hybrid_miss import hybrid_cause
from graph_kvcache_mcp.domain.diagnosis.prefix_diff import Cause

EDITED = Cause(kind="edited", detail="message 0 (user) was edited", fix="append instead")


def test_an_edit_inside_the_cached_prompt_names_the_state_past_the_shared_tokens() -> None:
    cause = hybrid_cause(EDITED, first_tokens=3384, common=1349, second_tokens=3387, block_size=32)
    assert cause.kind == "edited"
    assert cause.detail.startswith("message 0 (user) was edited. This is a hybrid model")
    assert "token 3360 of the first request, past the 1349 tokens both share" in cause.detail
    assert "the 1344 shared tokens a dense model would reuse" in cause.detail
    assert "warm-up call with just the shared head (its first 1344 tokens)" in cause.fix
    assert cause.fix.endswith("Also: append instead")


def test_a_prefix_of_whole_blocks_says_the_last_token_is_computed() -> None:
    new_turn = Cause(kind="new_turn", detail="a new turn", fix="nothing")
    cause = hybrid_cause(new_turn, first_tokens=70, common=64, second_tokens=64, block_size=32)
    assert "token 64, but vLLM computes the second request's last token" in cause.detail
    assert "resume at token 32 at most" in cause.detail
