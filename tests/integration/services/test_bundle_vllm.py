"""Bundles on a real vLLM (tiny local model): prefix reuse, exact token counts, chat turns."""

from __future__ import annotations

import secrets

import pytest

from graph_kvcache_mcp.connectors.vllm.tokens import VllmTokenCounter
from graph_kvcache_mcp.domain.bundle import Bundle
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.services.bundle.bundles import BundleChat, bundle_chat, compile_cached
from graph_kvcache_mcp.services.bundle.reuse import measure_bundle_reuse
from tests.support.bundles import corpus, request
from tests.support.engines import RunningEngine
from tests.support.vllm import BLOCK_SIZE, RunningVllm

pytestmark = pytest.mark.vllm


async def test_warm_calls_hit_whole_blocks_equal_to_the_metrics_delta_and_cold_calls_hit_none(
    vllm_server: RunningVllm,
) -> None:
    progress: list[tuple[int, int]] = []

    async def record(done: int, total: int, _message: str) -> None:
        progress.append((done, total))

    async with vllm_server.client() as client:
        report = await measure_bundle_reuse(
            client, bundles=3, items=30, token_budget=900, max_tokens=2, progress=record
        )
    assert report.reachable and report.summary is not None, report.reason
    cold = [c for c in report.calls if c.phase == "cold"]
    warm = [c for c in report.calls if c.phase == "warm"]
    assert len(cold) == len(warm) == 3
    for call in cold:
        assert call.cached_tokens_source == "usage"
        assert call.hit_tokens_usage == 0 == call.hit_tokens_metrics, call
    for call in warm:
        assert call.hit_tokens_usage is not None and call.hit_tokens_usage > 0, call
        assert call.hit_tokens_usage % BLOCK_SIZE == 0 and call.whole_blocks, call
        assert call.metrics_exclusive, call
        assert call.hit_tokens_usage == call.hit_tokens_metrics, call
        assert call.hit_tokens_usage > call.prompt_tokens // 2  # the bundle is most of the prompt
    assert report.summary.block_size == BLOCK_SIZE
    assert report.summary.usage_matches_metrics is True
    assert report.summary.cold_hit_tokens == 0
    assert progress == [(n, 6) for n in range(1, 7)]


async def test_a_cache_served_bundle_gives_the_next_turn_a_vllm_prefix_hit(
    vllm_server: RunningVllm, memory_engine: RunningEngine
) -> None:
    req = request(corpus(30, nonce=secrets.token_hex(6) + " "), "prefix cache", token_budget=900)
    kv = memory_engine.client()
    try:
        fresh = await compile_cached(req, kv=kv)
        served = await compile_cached(req, kv=kv)
    finally:
        await kv.aclose()
    assert (fresh.cache, served.cache) == ("miss", "hit")
    # A preamble of its own: the default one (and the bundle header) is shared by every bundle,
    # so vLLM would serve those first blocks from earlier tests' calls.
    preamble = f"Session {secrets.token_hex(8)}. Answer from the evidence below."
    async with vllm_server.client() as client:
        first = await bundle_chat(
            client, fresh.bundle, "What is reused?", system_preamble=preamble, max_tokens=2
        )
        second = await bundle_chat(
            client, served.bundle, "What is evicted?", system_preamble=preamble, max_tokens=2
        )
    assert isinstance(first, BundleChat) and isinstance(second, BundleChat)
    assert first.system_sha256 == second.system_sha256
    assert first.trace.prefix_cache_hit_tokens == 0
    hit = second.trace.prefix_cache_hit_tokens
    assert hit is not None and hit > 0 and hit % BLOCK_SIZE == 0


async def test_the_vllm_counter_fits_the_budget_with_the_served_tokenizer(
    vllm_server: RunningVllm,
) -> None:
    req = request(corpus(40, nonce=secrets.token_hex(6) + " "), "eviction", token_budget=700)
    async with vllm_server.client() as client:
        counter = VllmTokenCounter(client, vllm_server.model)
        counts = await counter.count_many(["", "hello world", "hello world hello world"])
        result = await compile_cached(req, kv=None, exact=counter)
        whole = await client.tokenize(result.bundle.text(), model=vllm_server.model)
        special = await client.tokenize("", model=vllm_server.model)
    assert not isinstance(counts, Unavailable)
    assert counts[0] == 0 and 0 < counts[1] < counts[2]
    bundle = result.bundle
    assert isinstance(bundle, Bundle) and result.reason is None
    assert bundle.token_counter == "vllm-tokenize/tiny-llama"
    assert bundle.tokens_used <= 700
    assert isinstance(whole, int) and isinstance(special, int)
    # Parts end at line breaks, where byte-level BPE rarely merges: the sum tracks the whole text
    # (the budget also counts the two section headings even when a section is absent).
    assert abs((whole - special) - bundle.tokens_used) <= 2 * len(bundle.items) + 12
