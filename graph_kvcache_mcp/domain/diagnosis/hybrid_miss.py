"""A prefix-cache miss on a hybrid model, explained in hybrid terms. Pure: no I/O.

A hybrid keeps a request's mamba state only where its prefill ended (its last full block), so the
second request resumes there or nowhere (`domain/vllm/hybrid/cache.py`). When that serves less
than the shared prefix would on a dense model, the cause the prompts show (an edit, a new turn)
is kept and the hybrid reason and fix are added to it.
"""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.prefix_diff import Cause
from graph_kvcache_mcp.domain.fleet.index import cacheable_tokens
from graph_kvcache_mcp.domain.vllm.hybrid.cache import state_position


def hybrid_cause(
    cause: Cause, *, first_tokens: int, common: int, second_tokens: int, block_size: int
) -> Cause:
    """`cause` with why a hybrid serves less than the shared prefix, and how to make the
    prefix reusable."""
    kept = state_position(first_tokens, block_size)
    limit = cacheable_tokens(second_tokens, block_size)
    shared = min(common, limit) // block_size * block_size
    if kept > common:
        where = f"token {kept} of the first request, past the {common} tokens both share"
    else:
        where = (
            f"token {kept}, but vLLM computes the second request's last token itself, so it "
            f"could resume at token {limit} at most"
        )
    detail = (
        f"{cause.detail}. This is a hybrid model: vLLM keeps the mamba state only where a "
        f"request's prefill ended (its last full block), here at {where}; the {shared} shared "
        "tokens a dense model would reuse cannot be resumed"
    )
    fix = (
        f"make the shared prefix end a request: e.g. a warm-up call with just the shared head "
        f"(its first {shared} tokens) keeps a state there for every prompt that extends it. "
        f"Also: {cause.fix}"
    )
    return cause.model_copy(update={"detail": detail, "fix": fix})
