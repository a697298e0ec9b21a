"""`external_cache_never_hits` judges an LMCache MP connector by what LMCache was asked and held,
not by vLLM's external hits alone: vLLM asks its connector only for what its own cache lacks."""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.stack_findings import (
    LmcacheFacts,
    VllmFacts,
    stack_findings,
)

# A cold benchmark on a healthy MP stack: vLLM's own cache served every repeat, LMCache held the
# chunks (found them on lookup) but vLLM needed none of them.
HEALTHY_VLLM = VllmFacts(
    target="http://127.0.0.1:8000/v1",
    reachable=True,
    kv_connector="LMCacheMPConnector",
    external_queries=30_720,
    external_hits=0,
    prefix_hits=27_648,
)
HEALTHY_LMCACHE = LmcacheFacts(
    target="http://127.0.0.1:8080", reachable=True, lookup_tokens=30_720, found_tokens=25_596
)


def fired(vllm: VllmFacts, lmcache: LmcacheFacts | None) -> bool:
    found = stack_findings(None, vllm, lmcache).findings
    return any(f.id == "external_cache_never_hits" for f in found)


def test_a_healthy_stack_whose_vllm_cache_served_everything_is_not_warned() -> None:
    assert not fired(HEALTHY_VLLM, HEALTHY_LMCACHE)


def test_lmcache_asked_holding_nothing_while_prompts_repeat_is_warned_with_its_counters() -> None:
    broken = HEALTHY_LMCACHE.model_copy(update={"found_tokens": 0})
    found = stack_findings(None, HEALTHY_VLLM, broken).findings
    warning = next(f for f in found if f.id == "external_cache_never_hits")
    assert "LMCache was asked for 30720 tokens and held none" in warning.evidence


def test_unique_prompts_that_nothing_could_serve_are_not_warned() -> None:
    cold = HEALTHY_VLLM.model_copy(update={"prefix_hits": 0})
    assert not fired(cold, HEALTHY_LMCACHE.model_copy(update={"found_tokens": 0}))


def test_without_lmcache_counters_vllms_external_counters_still_judge() -> None:
    assert fired(HEALTHY_VLLM, None)  # e.g. another connector: no lookups to read
    unreadable = HEALTHY_LMCACHE.model_copy(update={"lookup_tokens": None, "found_tokens": None})
    assert fired(HEALTHY_VLLM, unreadable)
