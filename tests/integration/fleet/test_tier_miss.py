"""diagnose_miss's tier answer on the real MP stack with the managed coordinator (engine, `lmcache
server` with our adapter, CPU vLLM, `lmcache coordinator`): each explanation checked against what
vLLM then reports and what LMCache's own lookup counters did. A never-sent prompt misses every
tier as never stored; after a vLLM restart one prompt is served from L1 and one evicted from L1
(cache evict) from the engine; after a stack restart L1 says the server restarted and the
engine serves; a stopped engine is "down"; a coordinator of another chunk size is named as the
mismatch; through the tools, vllm_chat's trace says why LMCache found nothing.
vLLM starts: 1 (stack) + 1 (vLLM restart) + 1 (stack restart)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection
from graph_kvcache_mcp.connectors.vllm.access import open_client
from graph_kvcache_mcp.domain.diagnosis.tier_miss import TierMiss, TierVerdict
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet, FleetInstance
from graph_kvcache_mcp.domain.lmcache.metrics import counters_moved
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.cache.operations import evict, resolve_target
from graph_kvcache_mcp.services.diagnosis.prefix_miss import MissDiagnosis, explain_miss
from graph_kvcache_mcp.services.fleet.tiers import TierSources
from graph_kvcache_mcp.services.vllm.views import VllmChatOut
from tests.integration.fleet.test_fleet_tiers import text_prompt
from tests.integration.fleet.test_stack_coordinator import (
    CoordinatedStack,
    coordinated_module_stack,
)
from tests.support.coordinator import running_coordinator
from tests.support.mcp_calls import call_ok
from tests.support.mp_stack import CHUNK_SIZE, cached_tokens_of
from tests.support.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatedStack]:
    yield from coordinated_module_stack(tmp_path_factory.mktemp("tier-miss-stack"))


def chat(seed: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text_prompt(seed)}]}


async def tiers_of(
    stack: CoordinatedStack, body: dict[str, Any], settings: Settings | None = None
) -> TierMiss:
    settings = settings or stack.settings
    async with open_client(settings) as client:
        out = await explain_miss(
            client, client.routes, body, body, model=MODEL_NAME, settings=settings
        )
    assert out.tiers is not None, out
    return out.tiers


def by_tier(miss: TierMiss) -> dict[str, TierVerdict]:
    return {verdict.tier: verdict for verdict in miss.tiers}


def send(stack: CoordinatedStack, body: dict[str, Any]) -> int:
    reply = httpx.post(
        f"{stack.vllm_root()}/v1/chat/completions",
        json={"model": MODEL_NAME, "max_tokens": 2, "temperature": 0, **body},
        timeout=300.0,
    )
    reply.raise_for_status()
    return cached_tokens_of(dict(reply.json()))


async def stored_in_both(stack: CoordinatedStack, body: dict[str, Any], whole: int) -> None:
    last = None
    with anyio.move_on_after(90):  # the server reports L1 within a second, stores L2 after
        while True:
            last = await tiers_of(stack, body)
            tiers = by_tier(last)
            if tiers["l1"].held_tokens == whole and tiers["l2"].held_tokens == whole:
                return
            await anyio.sleep(0.5)
    pytest.fail(f"not stored in L1 and L2 ({whole} tokens) within 90 s: {last}")


async def l1_empty(stack: CoordinatedStack, body: dict[str, Any]) -> None:
    with anyio.fail_after(60):
        while True:
            if by_tier(await tiers_of(stack, body))["l1"].held_tokens == 0:
                return
            await anyio.sleep(0.5)


async def evict_from_l1(stack: CoordinatedStack, body: dict[str, Any]) -> None:
    """cache_evict's own path: the target resolved through the fleet, then the L1 delete."""
    fleet = Fleet(
        instances=(
            FleetInstance(
                name="a",
                base_url=f"{stack.vllm_root()}/v1",
                lmcache_http_url=f"http://127.0.0.1:{stack.http_port}",
            ),
        )
    )
    conn = FleetConnection(fleet)
    try:
        target = await resolve_target(
            conn, TierSources(stack.settings), "a", request=body, prompt=None
        )
    finally:
        await conn.aclose()
    assert not isinstance(target, Unavailable), target
    assert (await evict("a", target, tier="l1")).done


async def test_each_tier_miss_is_explained_and_equals_what_vllm_and_lmcache_then_count(
    stack: CoordinatedStack,
) -> None:
    await stack.ensure()
    never = await tiers_of(stack, chat("never"))
    assert never.cached_tokens == 0
    assert [(v.tier, v.why) for v in never.tiers] == [
        ("vllm", "never_stored"),
        ("l1", "never_stored"),
        ("l2", "never_stored"),
    ]
    assert never.mismatches == [] and never.early_exits == {}

    kept, evicted = chat("kept"), chat("evicted")
    for body in (kept, evicted):
        send(stack, body)
        whole = (await tiers_of(stack, body)).prompt_tokens // CHUNK_SIZE * CHUNK_SIZE
        assert whole >= 2 * CHUNK_SIZE
        await stored_in_both(stack, body, whole)
    await evict_from_l1(stack, evicted)
    await l1_empty(stack, evicted)

    stack.vllm.stop(term_wait_s=10.0)
    await stack.ensure()
    from_l1 = await tiers_of(stack, kept)
    from_l2 = await tiers_of(stack, evicted)

    l1 = by_tier(from_l1)
    assert (l1["vllm"].why, l1["l1"].why, l1["l2"].why) == ("restarted", "served", "not_needed")
    before = stack.lmcache_counters()
    assert send(stack, kept) == from_l1.cached_tokens == l1["l1"].serves_tokens
    moved = counters_moved(before, stack.lmcache_counters())
    assert (moved.l1_hit_tokens, moved.l2_hit_tokens) == (l1["l1"].held_tokens, 0)

    l2 = by_tier(from_l2)
    assert (l2["vllm"].why, l2["l1"].why, l2["l2"].why) == ("restarted", "evicted", "served")
    assert "cache_evict" in l2["l1"].detail
    before = stack.lmcache_counters()
    assert send(stack, evicted) == from_l2.cached_tokens == l2["l2"].serves_tokens
    moved = counters_moved(before, stack.lmcache_counters())
    assert (moved.l1_hit_tokens, moved.l2_hit_tokens) == (0, l2["l2"].held_tokens)


async def test_a_coordinator_of_another_chunk_size_is_named_as_the_mismatch(
    stack: CoordinatedStack, tmp_path: Path
) -> None:
    await stack.ensure()
    with running_coordinator(tmp_path, chunk_size=2 * CHUNK_SIZE) as url:
        fleet = tmp_path / "fleet.json"
        fleet.write_text(
            json.dumps(
                {
                    "instances": [
                        {
                            "name": "a",
                            "base_url": f"{stack.vllm_root()}/v1",
                            "lmcache_http_url": f"http://127.0.0.1:{stack.http_port}",
                        }
                    ],
                    "coordinator_url": url,
                }
            )
        )
        settings = stack.settings.model_copy(update={"fleet_file": fleet})
        miss = await tiers_of(stack, chat("mismatch"), settings)
    assert any("--chunk-size 256" in m for m in miss.mismatches), miss.mismatches


async def test_the_tool_and_the_per_call_trace_explain_a_prompt_no_tier_holds(
    stack: CoordinatedStack,
) -> None:
    await stack.ensure()
    settings = stack.settings.model_copy(update={"toolsets": ("vllm", "diagnose")})
    body = chat("traced")
    async with Client(build_server(settings)) as client:
        diagnosed = await call_ok(client, "diagnose_miss", {"first": body, "second": body})
        chatted = await call_ok(
            client, "vllm_chat", {"messages": body["messages"], "max_tokens": 2}
        )
    tiers = MissDiagnosis.model_validate(diagnosed).tiers
    assert tiers is not None
    assert [(v.tier, v.why) for v in tiers.tiers[1:]] == [
        ("l1", "never_stored"),
        ("l2", "never_stored"),
    ]
    trace = VllmChatOut.model_validate(chatted).trace
    assert trace is not None and trace.prompt_tokens == tiers.prompt_tokens
    assert (trace.lmcache_l1_hit_tokens, trace.lmcache_l2_hit_tokens) == (0, 0)
    assert trace.note is not None and "held 0 of the" in trace.note


async def test_a_server_restart_is_named_and_the_engine_serves_as_predicted(
    stack: CoordinatedStack,
) -> None:
    await stack.ensure()
    body = chat("server")
    send(stack, body)
    whole = (await tiers_of(stack, body)).prompt_tokens // CHUNK_SIZE * CHUNK_SIZE
    await stored_in_both(stack, body, whole)
    stack.vllm.stop(term_wait_s=10.0)
    stack.lmcache.stop(term_wait_s=10.0)  # a clean stop: it deregisters, its L2 placements stay
    await stack.ensure()

    miss = await tiers_of(stack, body)
    tiers = by_tier(miss)
    assert (tiers["vllm"].why, tiers["l1"].why, tiers["l2"].why) == (
        "restarted",
        "server_restarted",
        "served",
    )
    before = stack.lmcache_counters()
    assert send(stack, body) == miss.cached_tokens == tiers["l2"].serves_tokens
    moved = counters_moved(before, stack.lmcache_counters())
    assert (moved.l1_hit_tokens, moved.l2_hit_tokens) == (0, tiers["l2"].held_tokens)


async def test_an_engine_that_is_down_reads_as_down_never_as_not_stored(
    stack: CoordinatedStack,
) -> None:
    await stack.ensure()
    stack.engine.stop(term_wait_s=5.0)  # the next test's ensure starts it again
    with anyio.fail_after(60):
        tiers = by_tier(await tiers_of(stack, chat("down")))
    assert (tiers["l2"].why, tiers["l2"].held_tokens, tiers["l2"].serves_tokens) == (
        "down",
        None,
        None,
    )
    assert stack.engine_url.removeprefix("http://") in tiers["l2"].detail
