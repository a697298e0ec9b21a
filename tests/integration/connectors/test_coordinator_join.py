"""The planned coordinator and a server joined to it, both real (no vLLM): the server registers,
the L1 tier reads its (empty) directory as trusted, and a clean stop leaves the checkpoint in the
coordinator's state dir for the next start."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.processes.ports import free_port
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
