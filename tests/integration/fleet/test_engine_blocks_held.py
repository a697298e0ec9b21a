"""fleet where's engine tier for an EngineKVConnector instance, against a real engine: a block
is held only while every tensor-parallel rank's key is (as the connector's scheduler counts a
hit), one rank asks for the chain keys themselves, and a down engine is a reason, not a count.
The whole path through a running vLLM is tests/integration/fleet/test_fleet_engine_connector.py
(one rank)."""

from __future__ import annotations

import uuid

from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.engine_kv.device import rank_key
from graph_kvcache_mcp.services.fleet.tiers import engine_blocks_held
from tests.support.engines import RunningEngine


def chain(count: int) -> list[str]:
    run = uuid.uuid4().hex
    return [f"vkv1:fleet-{run}-{i}" for i in range(count)]


async def test_a_block_one_rank_misses_is_not_held(memory_engine: RunningEngine) -> None:
    keys = chain(5)
    stored = [
        rank_key(key, rank=rank, size=2)
        for index, key in enumerate(keys)
        for rank in (0, 1)
        if (index, rank) != (2, 1)
    ]
    kv = memory_engine.client()
    try:
        for key in stored:
            await kv.put(key, b"v")
        held = await engine_blocks_held(kv, keys, 2)
        one_rank = await engine_blocks_held(kv, keys, 1)
    finally:
        await kv.aclose()
    assert held == [True, True, False, True, True]
    assert one_rank == [False] * 5  # one rank's keys are the chain keys: none stored


async def test_one_rank_heads_the_chain_keys(memory_engine: RunningEngine) -> None:
    keys = chain(3)
    kv = memory_engine.client()
    try:
        await kv.put(keys[0], b"v")
        held = await engine_blocks_held(kv, keys, 1)
    finally:
        await kv.aclose()
    assert held == [True, False, False]


async def test_a_down_engine_is_a_reason() -> None:
    kv = KvClient.connect("http://127.0.0.1:9", None, timeout_s=1.0)
    try:
        held = await engine_blocks_held(kv, chain(2), 2)
    finally:
        await kv.aclose()
    assert isinstance(held, Unavailable)
