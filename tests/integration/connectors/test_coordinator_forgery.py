"""A second local user (`nobody`) against a coordinator we did not start: LMCache's own, named by
URL, with no filter in front of it. The managed server joined to it (through our entry point)
reports the id it registered under, so registrations forged at its address and a deleted
registration never make our tools act on someone else's instance; deletes the neighbour asks
that coordinator to forward (an L2 delete, a forced L1 one) are refused by the server's filter;
and the coordinator's L1 answers are marked untrusted unless the user opts in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp
from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus
from graph_kvcache_mcp.domain.fleet.tier_trust import REPORTED_INSTANCE_ROUTE
from graph_kvcache_mcp.services.fleet.tiers import TierSources
from tests.integration.connectors.test_stack_neighbours import lmcache_started
from tests.support.coordinator import running_coordinator
from tests.support.engines import RunningEngine
from tests.support.neighbour import as_nobody

pytestmark = pytest.mark.lmcache
TOKENS = list(range(1, 601))
REGISTER_S = 60.0


@pytest.fixture
def joined(
    memory_engine: RunningEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, LmcacheStatus]]:
    """An unfiltered coordinator (its URL) and the managed server `lmcache start` joined to it."""
    (tmp_path / "c").mkdir()
    with (
        running_coordinator(tmp_path / "c") as url,
        lmcache_started(memory_engine, tmp_path / "d", monkeypatch, "--coordinator", url) as server,
    ):
        yield url, server.status()


async def _registered(coordinator: CoordinatorHttp, port: int, ours: str) -> None:
    with anyio.fail_after(REGISTER_S):  # it registers at start, again at each heartbeat
        while True:
            if await coordinator.instance_id("127.0.0.1", port, reported=ours) == ours:
                return
            await anyio.sleep(0.5)


async def test_forged_registrations_and_deletes_change_nothing_we_report(
    joined: tuple[str, LmcacheStatus], tmp_path: Path
) -> None:
    url, status = joined
    assert status.http_url is not None
    port = int(status.http_url.rsplit(":", 1)[1])
    async with LmcacheHttp(status.http_url) as server:
        ours = await server.instance_id()
    assert ours is not None
    told = await anyio.to_thread.run_sync(
        partial(as_nobody, "http", "GET", status.http_url + REPORTED_INSTANCE_ROUTE)
    )
    assert told["status"] == 404 and ours not in told["body"]  # the owner's to know

    async def nobody(method: str, path: str, body: object) -> dict[str, object]:
        call = partial(as_nobody, "http", method, url + path, json.dumps(body))
        return await anyio.to_thread.run_sync(call)

    async with CoordinatorHttp(url) as coordinator:
        await _registered(coordinator, port, ours)
        # Deletes the neighbour has the coordinator forward, as our user, to our server.
        prompt = {"instance_id": ours, "model_name": "m", "world_size": 1, "token_ids": TOKENS}
        l2 = await nobody("POST", "/cache/delete", {**prompt, "tier": "l2"})
        forced = await nobody("POST", "/cache/delete", {**prompt, "tier": "l1", "force": True})
        # A registration at our address newer than ours, then ours deleted.
        forged = {"instance_id": "forged", "ip": "127.0.0.1", "http_port": port}
        registered = await nobody("POST", "/instances", forged)
        deleted = await nobody("DELETE", f"/instances/{ours}", {})
        newest = await coordinator.instance_id("127.0.0.1", port)  # the rule before #38
        resolved = await coordinator.instance_id("127.0.0.1", port, reported=ours)
        await _registered(coordinator, port, ours)  # our heartbeat re-registers us
        after = await coordinator.instance_id("127.0.0.1", port, reported=ours)

    for refused in (l2, forced):  # our filter answered 403: the coordinator's forward failed
        assert refused["status"] == 502 and "403" in str(refused["body"]), refused
    assert (registered["status"], deleted["status"]) == (200, 204)  # the attack itself worked
    assert newest == "forged"  # ... and the newest registration is the attacker's
    assert resolved is None and after == ours  # ours is never taken for theirs

    settings = Settings(data_dir=tmp_path / "d")
    distrust = TierSources(settings).coordinator_distrust(url)
    assert distrust is not None and distrust.startswith("untrusted: ")
    assert "GRAPH_KVCACHE_TRUST_UNMANAGED_COORDINATOR" in distrust
    opted_in = settings.model_copy(update={"trust_unmanaged_coordinator": True})
    assert TierSources(opted_in).coordinator_distrust(url) is None
