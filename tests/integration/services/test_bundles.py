"""compile_cached on real engines: hits skip assembly, edits miss, a down store never fails."""

from __future__ import annotations

import secrets
from typing import Any

from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.connectors.vllm.tokens import VllmTokenCounter
from graph_kvcache_mcp.domain.bundle import (
    Bundle,
    BundleRequest,
    EstimateCounter,
    RejectedBundle,
    bundle_key,
)
from graph_kvcache_mcp.domain.engine.keys import check_key
from graph_kvcache_mcp.domain.outcomes import Miss, Unavailable
from graph_kvcache_mcp.services.bundle.bundles import BundleCounters, compile_cached, load_bundle
from tests.support.bundles import corpus, request
from tests.support.engines import RunningEngine


def fresh_request(count: int = 40, **params: Any) -> BundleRequest:
    # A nonce in the evidence: every test starts cold even on a shared session engine.
    return request(corpus(count, nonce=secrets.token_hex(6) + " "), "prefix cache", **params)


async def test_second_compile_is_a_hit_that_skips_assembly(engine: RunningEngine) -> None:
    req = fresh_request(token_budget=900)
    counters = BundleCounters()
    kv = engine.client()
    try:
        first = await compile_cached(req, kv=kv, counters=counters)
        assert (first.cache, first.kv_cache_hit, first.assembled) == ("miss", False, True)
        assert first.stored == "stored_new"
        assert counters.assemblies == 1

        second = await compile_cached(req, kv=kv, counters=counters)
    finally:
        await kv.aclose()
    assert (second.cache, second.kv_cache_hit, second.assembled) == ("hit", True, False)
    assert counters.assemblies == 1  # scoring, MMR, budget fit and proof graph did not run
    assert (counters.cache_hits, counters.cache_misses) == (1, 1)
    assert second.bundle == first.bundle
    turn = "Which blocks are reused?"
    assert second.bundle.as_prompt_messages(turn) == first.bundle.as_prompt_messages(turn)


async def test_editing_one_character_of_one_item_misses_and_assembles(
    memory_engine: RunningEngine,
) -> None:
    req = fresh_request()
    items = list(req.items)
    items[7] = items[7].model_copy(update={"text": items[7].text + "."})
    edited = req.model_copy(update={"items": tuple(items)})
    counters = BundleCounters()
    kv = memory_engine.client()
    try:
        await compile_cached(req, kv=kv, counters=counters)
        again = await compile_cached(edited, kv=kv, counters=counters)
    finally:
        await kv.aclose()
    assert (again.cache, again.assembled, counters.assemblies) == ("miss", True, 2)


async def test_a_down_store_still_returns_the_bundle_with_the_reason() -> None:
    kv = KvClient.connect("http://127.0.0.1:9", None, timeout_s=1.0)
    counters = BundleCounters()
    try:
        result = await compile_cached(fresh_request(), kv=kv, counters=counters)
    finally:
        await kv.aclose()
    assert (result.cache, result.kv_cache_hit, result.assembled) == ("unavailable", False, True)
    assert result.reason is not None and "not reachable" in result.reason
    assert result.bundle.items
    assert counters.cache_unavailable == 1


async def test_a_corrupt_entry_under_the_key_is_a_miss_not_an_error(
    memory_engine: RunningEngine,
) -> None:
    req = fresh_request()
    key = bundle_key(req, token_counter=EstimateCounter.name)
    counters = BundleCounters()
    kv = memory_engine.client()
    try:
        await kv.put(key, b'{"format": "ctxbundle/1", "checksum": "sha256:00", "payload": {}}')
        result = await compile_cached(req, kv=kv, counters=counters)
        loaded = await load_bundle(kv, key)
    finally:
        await kv.aclose()
    assert (result.cache, result.assembled, counters.rejected_entries) == ("miss", True, 1)
    assert result.stored == "already_present"  # the engine keeps the first value written
    assert result.reason is not None and "unusable" in result.reason
    assert isinstance(loaded, RejectedBundle)


async def test_with_a_secret_keys_differ_and_entries_are_signed(
    memory_engine: RunningEngine,
) -> None:
    req = fresh_request()
    counters = BundleCounters()
    kv = memory_engine.client()
    try:
        signed = await compile_cached(req, kv=kv, secret=b"k1", counters=counters)
        hit = await compile_cached(req, kv=kv, secret=b"k1", counters=counters)
        unsigned_view = await load_bundle(kv, signed.bundle.key)
        signed_view = await load_bundle(kv, signed.bundle.key, secret=b"k1")
    finally:
        await kv.aclose()
    assert signed.bundle.key != bundle_key(req, token_counter=EstimateCounter.name)
    assert hit.cache == "hit"
    assert isinstance(unsigned_view, RejectedBundle)
    assert isinstance(signed_view, Bundle)


async def test_load_bundle_reports_an_unknown_key_as_a_miss(memory_engine: RunningEngine) -> None:
    kv = memory_engine.client()
    try:
        outcome = await load_bundle(kv, check_key("ctxbundle:" + "ab" * 32))
    finally:
        await kv.aclose()
    assert outcome == Miss()


async def test_without_a_store_the_cache_is_off() -> None:
    result = await compile_cached(fresh_request(), kv=None)
    assert (result.cache, result.assembled, result.stored) == ("off", True, None)


async def test_an_unreachable_store_handed_in_still_compiles() -> None:
    counters = BundleCounters()
    result = await compile_cached(
        fresh_request(), kv=Unavailable("engine down for the test"), counters=counters
    )
    assert (result.cache, result.assembled) == ("unavailable", True)
    assert result.reason == "store not used: engine down for the test"
    assert counters.cache_unavailable == 1


async def test_an_unreachable_vllm_counter_falls_back_to_the_estimate_and_says_so() -> None:
    async with VllmClient(f"http://127.0.0.1:{free_port()}/v1", max_retries=0) as client:
        result = await compile_cached(fresh_request(), kv=None, exact=VllmTokenCounter(client, "m"))
    assert result.bundle.token_counter.startswith("estimate/")
    assert result.reason is not None and "exact token count unavailable" in result.reason
