"""The coordinator client against a real `lmcache coordinator`: an unregistered server and an
empty directory read as such, a coordinator that is down as Unavailable within the deadline."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.outcomes import Unavailable
from tests.support.coordinator import running_coordinator

pytestmark = [pytest.mark.lmcache]
TOKENS = list(range(1, 601))  # two whole chunks of 256 and a partial one


async def test_a_fresh_coordinator_knows_no_server_and_no_chunk(tmp_path: Path) -> None:
    with running_coordinator(tmp_path) as url:
        async with CoordinatorHttp(url) as coordinator:
            assert await coordinator.instance_id("127.0.0.1", 8080) is None
            chunks = await coordinator.l1_chunks(TOKENS, model="m", instance_id="nobody")
    assert chunks == [False, False]


async def test_a_coordinator_that_is_down_is_unavailable_within_the_deadline() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with anyio.fail_after(10):
        async with CoordinatorHttp(url, timeout_s=2.0) as coordinator:
            found = await coordinator.instance_id("127.0.0.1", 8080)
            chunks = await coordinator.l1_chunks(TOKENS, model="m", instance_id="x")
    assert isinstance(found, Unavailable) and url in found.reason
    assert isinstance(chunks, Unavailable) and "not reachable" in chunks.reason
