"""The shared vLLM client is closed only when no call holds it (nothing is sent to a server)."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.vllm.access import VllmAccess, VllmAccessClosed
from graph_kvcache_mcp.connectors.vllm.client import VllmClient

OTHER_URL = "http://127.0.0.1:9/v1"


async def test_a_borrowed_client_outlives_a_switch_and_closes_with_its_last_borrower(
    tmp_path: Path,
) -> None:
    access = VllmAccess(Settings.build(data_dir=tmp_path))
    async with access.borrowed() as first:
        await access.use(OTHER_URL)
        assert not first.closed
        async with access.borrowed() as second:
            assert second is not first and second.base_url == OTHER_URL
        assert not second.closed  # still the current client
    assert first.closed
    await access.aclose()
    assert second.closed


async def test_aclose_waits_for_the_running_call_then_refuses_new_ones(tmp_path: Path) -> None:
    access = VllmAccess(Settings.build(data_dir=tmp_path))
    held: list[VllmClient] = []
    borrowed, release, closed = anyio.Event(), anyio.Event(), anyio.Event()

    async def call() -> None:
        async with access.borrowed() as client:
            held.append(client)
            borrowed.set()
            await release.wait()

    async def shut_down() -> None:
        await access.aclose()
        closed.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await borrowed.wait()
            group.start_soon(shut_down)
            while not await _refused(access):  # aclose has begun: new calls are turned away
                await anyio.lowlevel.checkpoint()
            assert not held[0].closed and not closed.is_set()
            release.set()
            await closed.wait()
    assert held[0].closed


async def test_a_cancelled_last_borrower_still_closes_a_retired_client(tmp_path: Path) -> None:
    access = VllmAccess(Settings.build(data_dir=tmp_path))
    held: list[VllmClient] = []
    with anyio.CancelScope() as scope:
        async with access.borrowed() as client:
            held.append(client)
            await access.use(OTHER_URL)
            scope.cancel()
            await anyio.sleep_forever()
    assert held[0].closed
    await access.aclose()


async def test_aclose_completes_from_a_cancelled_scope(tmp_path: Path) -> None:
    """The lifespan closes from a cancelled scope; the cleanup after this one must still run."""
    access = VllmAccess(Settings.build(data_dir=tmp_path))
    async with access.borrowed() as client:
        pass
    after: list[str] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        await access.aclose()
        after.append("reached")
    assert client.closed and after == ["reached"]
    assert await _refused(access)


async def _refused(access: VllmAccess) -> bool:
    try:
        async with access.borrowed():
            return False
    except VllmAccessClosed:
        return True
