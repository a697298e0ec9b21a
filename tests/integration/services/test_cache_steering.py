"""cache_* against a real coordinator and a real server joined to it (no vLLM attached): an L1
evict is done, an L2 evict never reads as done, pins are bookkeeping with their note, and a warm
the server cannot serve says why instead of succeeding."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import coordinator_url
from graph_kvcache_mcp.services.cache.operations import (
    L2_KEPT,
    PIN_NOTE,
    CacheTarget,
    evict,
    pin,
    warm,
)
from tests.support.coordinator import running_coordinator
from tests.support.engines import RunningEngine
from tests.support.lmcache import TEST_MODEL, running_lmcache_server

pytestmark = [pytest.mark.lmcache]
TOKENS = list(range(1, 601))  # two whole chunks


async def registered(url: str, http_url: str) -> str:
    port = int(http_url.rsplit(":", 1)[1])
    async with CoordinatorHttp(url) as coordinator:
        with anyio.fail_after(60):
            while True:
                found = await coordinator.instance_id("127.0.0.1", port)
                if found is not None:
                    break
                await anyio.sleep(0.5)
    assert isinstance(found, str), found
    return found


async def test_steering_says_what_really_happened(engine: RunningEngine, tmp_path: Path) -> None:
    url = coordinator_url(free_port())
    with (
        running_coordinator(tmp_path, port=int(url.rsplit(":", 1)[1])),
        running_lmcache_server(engine, tmp_path, coordinator_url=url) as server,
    ):
        target = CacheTarget(url, await registered(url, server.http_url), TEST_MODEL.name, TOKENS)
        l1 = await evict("a", target, tier="l1")
        l2 = await evict("a", target, tier="l2")
        pinned = await pin("a", target, on=True)
        unpinned = await pin("a", target, on=False)
        with anyio.fail_after(30):
            warmed = await warm("a", target, timeout_s=10.0)
    assert (l1.done, l1.chunks, l1.affected) == (True, 2, 0)
    assert (l2.done, l2.reason) == (False, L2_KEPT)
    assert (pinned.done, pinned.chunks, pinned.note) == (True, 2, PIN_NOTE)
    assert unpinned.done and unpinned.affected == pinned.affected
    assert warmed.done is False and warmed.reason  # no vLLM registered a layout on the server
