"""The task runner on a server of its own (in memory, the SDK's client): a call's progress shows
in `tasks/get`, `tasks/cancel` stops an async call, `tasks/update` is acknowledged, and a legacy
(2025) connection or a tool not named for tasks runs inline."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult

from graph_kvcache_mcp.host.strict_server import StrictServer
from graph_kvcache_mcp.host.tasks import TaskRunner
from tests.support.task_client import (
    TasksClientExtension,
    cancel_task,
    get_task,
    start_task,
    update_task,
    wait_ended,
)


def _server(stopped: list[str]) -> StrictServer[None]:
    runner = TaskRunner(lambda name: name.startswith("slow"))

    @asynccontextmanager
    async def lifespan(_app: StrictServer[None]) -> AsyncIterator[None]:
        async with runner.serving():
            yield None

    server: StrictServer[None] = StrictServer("tasks", lifespan=lifespan, extensions=[runner])

    async def slow_forever(ctx: Context[None]) -> dict[str, str]:
        """Report progress, then wait until cancelled."""
        await ctx.report_progress(1, total=3, message="step one")
        try:
            await anyio.sleep_forever()
        finally:
            stopped.append("slow_forever")
        return {}

    async def slow_echo(text: str) -> dict[str, str]:
        """Answer `text`."""
        return {"text": text}

    server.add_tool(slow_forever)
    server.add_tool(slow_echo)
    server.add_tool(slow_echo, name="quick_echo")
    return server


async def _progressed(client: Client, task_id: str) -> str:
    with anyio.fail_after(10):
        while True:
            message = (await get_task(client, task_id)).status_message
            if message != "slow_forever is running":
                assert message is not None
                return message
            await anyio.sleep(0.05)


async def test_progress_shows_in_tasks_get_and_cancel_stops_an_async_call() -> None:
    stopped: list[str] = []
    async with Client(_server(stopped), extensions=[TasksClientExtension()]) as client:
        created = await start_task(client, "slow_forever", {})
        progress = await _progressed(client, created.task_id)
        await cancel_task(client, created.task_id)
        ended = await wait_ended(client, created.task_id, timeout_s=10)
    assert progress == "step one (1/3)"
    assert ended.status == "cancelled" and ended.result is None
    assert stopped == ["slow_forever"]


async def test_a_completed_task_carries_the_tool_result_and_update_is_acknowledged() -> None:
    async with Client(_server([]), extensions=[TasksClientExtension()]) as client:
        created = await start_task(client, "slow_echo", {"text": "hi"})
        ended = await wait_ended(client, created.task_id, timeout_s=10)
        ack = await update_task(client, created.task_id, {})
        bad = await start_task(client, "slow_echo", {"text": 5})
        refused = await wait_ended(client, bad.task_id, timeout_s=10)
    assert ended.status == "completed" and ended.result is not None
    assert ended.result["structuredContent"] == {"text": "hi"}
    assert ack.model_dump(exclude={"meta"}, by_alias=True) == {"resultType": "complete"}
    assert refused.status == "completed" and refused.result is not None
    assert refused.result["isError"] is True  # a tool error completes the task (spec)


@pytest.mark.parametrize(("mode", "tool"), [("legacy", "slow_echo"), ("auto", "quick_echo")])
async def test_a_legacy_connection_or_a_quick_tool_runs_inline(mode: Any, tool: str) -> None:
    async with Client(_server([]), mode=mode, extensions=[TasksClientExtension()]) as client:
        answer = await client.session.call_tool(tool, {"text": "hi"}, allow_claimed=True)
    assert isinstance(answer, CallToolResult), answer
    assert answer.structured_content == {"text": "hi"}
