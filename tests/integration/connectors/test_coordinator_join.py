"""The planned coordinator and a server joined to it, both real (no vLLM): the server registers,
the L1 tier reads its (empty) directory as trusted, and a clean stop leaves the checkpoint in the
coordinator's state dir for the next start."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.fleet.memory import PoolUse, server_memory
from graph_kvcache_mcp.domain.fleet.tiers import ServerKeying
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import CHECKPOINT_FILE, coordinator_url
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.services.fleet.tiers import l1_held
from tests.support.coordinator import running_coordinator
from tests.support.engines import RunningEngine
from tests.support.lmcache import running_lmcache_server

pytestmark = [pytest.mark.lmcache]
TOKENS = list(range(1, 601))
REGISTER_S = 60.0


async def test_a_joined_server_registers_and_its_l1_reads_as_trusted(
    engine: RunningEngine, tmp_path: Path
) -> None:
    url = coordinator_url(free_port())
    port = int(url.rsplit(":", 1)[1])
    with (
        running_coordinator(tmp_path, port=port),
        running_lmcache_server(engine, tmp_path, coordinator_url=url) as server,
    ):
        http_port = int(server.http_url.rsplit(":", 1)[1])
        async with CoordinatorHttp(url) as coordinator:
            with anyio.fail_after(REGISTER_S):
                while True:
                    found = await coordinator.instance_id("127.0.0.1", http_port)
                    assert not isinstance(found, Unavailable), found
                    if found is not None:
                        break
                    await anyio.sleep(0.5)
        l1 = await l1_held(url, server.http_url, TOKENS, ServerKeying(), model="m")
    assert (l1.tokens, l1.trusted, l1.reason) == (0, True, None)
    assert (tmp_path / CHECKPOINT_FILE).exists()  # written at the clean stop


async def _registered(url: str, http_port: int) -> str:
    async with CoordinatorHttp(url) as coordinator:
        with anyio.fail_after(REGISTER_S):  # a server re-registers at its next heartbeat
            while True:
                found = await coordinator.instance_id("127.0.0.1", http_port)
                assert not isinstance(found, Unavailable), found
                if found is not None:
                    return found
                await anyio.sleep(0.5)


async def test_fleet_memory_lists_the_servers_l1_and_a_restarted_coordinator_is_untrusted(
    engine: RunningEngine, tmp_path: Path
) -> None:
    """The coordinator reports the joined server's L1 pool. Restarted after the server, with or
    without its checkpoint, it may lack what the server stored before: its L1 answer is then a
    lower bound, marked untrusted with the reason, never trusted."""
    url = coordinator_url(free_port())
    port = int(url.rsplit(":", 1)[1])
    (durable := tmp_path / "durable").mkdir()
    (blank := tmp_path / "blank").mkdir()
    with ExitStack() as stack:
        first = ExitStack()
        stack.callback(first.close)
        first.enter_context(running_coordinator(durable, port=port))
        server = stack.enter_context(running_lmcache_server(engine, tmp_path, coordinator_url=url))
        http_port = int(server.http_url.rsplit(":", 1)[1])
        instance = await _registered(url, http_port)
        l1_pool = await _l1_pool(url, instance)
        assert l1_pool is not None and l1_pool.capacity_bytes == int(0.1 * 1024**3)
        before = await l1_held(url, server.http_url, TOKENS, ServerKeying(), model="m")
        assert (before.tokens, before.trusted) == (0, True)
        first.close()  # a clean stop writes the checkpoint into `durable`
        assert (durable / CHECKPOINT_FILE).exists()
        for state_dir in (blank, durable):
            with running_coordinator(state_dir, port=port):
                await _registered(url, http_port)
                after = await l1_held(url, server.http_url, TOKENS, ServerKeying(), model="m")
            assert (after.tokens, after.trusted) == (0, False), state_dir
            assert after.reason is not None and after.reason.startswith("untrusted")
            assert "after this server" in after.reason


async def _l1_pool(url: str, instance: str) -> PoolUse | None:
    """The server's L1 pool as the coordinator reports it (capacity comes on its event stream)."""
    async with CoordinatorHttp(url) as coordinator:
        with anyio.fail_after(REGISTER_S):
            while True:
                usage = await coordinator.usage()
                assert not isinstance(usage, Unavailable), usage
                memory = server_memory(usage, instance, server="s", instances=["a"])
                if memory.l1 is not None:
                    return memory.l1
                await anyio.sleep(0.5)
