"""Our coordinator client against a second local user (`nobody`) holding the coordinator's
loopback port (one that died, or one bound first): it is sent nothing, not one token id, and
nothing it could answer is believed. The owner's own coordinator still answers
(`test_coordinator_http`)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.outcomes import Unavailable
from tests.support.engines import require_in_ci
from tests.support.lmcache import require_lmcache
from tests.support.neighbour import as_nobody, can_run_as_nobody, squat_now, squatter_received

TOKENS = list(range(1, 601))


async def test_a_squatter_on_the_coordinators_port_gets_no_token_ids_and_is_not_believed() -> None:
    if not can_run_as_nobody():
        require_in_ci("root with setpriv and /usr/bin/python3 (a second local user)")
    port = free_port()
    squatter = squat_now(port)
    try:
        with anyio.fail_after(30):
            async with CoordinatorHttp(f"http://127.0.0.1:{port}") as coordinator:
                chunks = await coordinator.l1_chunks(TOKENS, model="m", instance_id="ours")
                lookup = await coordinator.lookup(TOKENS, model="m")
                found = await coordinator.instance_id("127.0.0.1", 8080)
    finally:
        received = squatter_received(squatter)
    for answer in (chunks, lookup, found):
        assert isinstance(answer, Unavailable) and "another user's process" in answer.reason
    assert received == []


NEIGHBOUR_ROUTES = (
    ("GET", "/directory/keys"),
    ("POST", "/directory/lookup"),
    ("GET", "/instances"),
    ("POST", "/events"),
    ("DELETE", "/instances/ours"),
    ("PUT", "/quota/config"),
    ("GET", "/metrics"),
)


@pytest.mark.lmcache
async def test_the_managed_coordinator_answers_its_owner_only(tmp_path: Path) -> None:
    if not can_run_as_nobody():
        require_in_ci("root with setpriv and /usr/bin/python3 (a second local user)")
    managed = ManagedCoordinator(tmp_path, python=require_lmcache().parent / "python")
    state = await anyio.to_thread.run_sync(
        lambda: managed.ensure(chunk_size=256, hash_algorithm="blake3")
    )
    try:
        for method, path in NEIGHBOUR_ROUTES:
            answer = await anyio.to_thread.run_sync(
                partial(as_nobody, "http", method, state.url + path)
            )
            assert answer["status"] == 403, (method, path, answer)
        async with CoordinatorHttp(state.url) as coordinator:
            assert await coordinator.instances() == []
            assert await coordinator.l1_chunks(TOKENS, model="m", instance_id="x") == [False] * 2
    finally:
        await anyio.to_thread.run_sync(managed.stop)
