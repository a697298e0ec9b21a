"""The MCP Python SDK's own `Client` as a tasks-extension client (`io.modelcontextprotocol/tasks`).

SDK 2.3 ships the client side of extensions (`ClientExtension`, `ResultClaim`) but no tasks
extension, so this declares the extension's wire shapes as the specification
(modelcontextprotocol/ext-tasks, `specification/draft/tasks.md`) gives them and sends
`tasks/get` / `tasks/cancel` through the SDK's session (which sets the `Mcp-Name` header).
Nothing of the server's code is used: a test talks to the server as any tasks client would.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.types import CallToolResult, RequestParams, Result
from mcp.types import Request as McpRequest
from pydantic import ConfigDict

TASKS = "io.modelcontextprotocol/tasks"


class TaskState(Result):
    """A task as `tasks/get` answers it (and the seed a `tools/call` answers with)."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class CreatedTask(TaskState):
    result_type: Literal["task"]


class _TaskIdParams(RequestParams):
    task_id: str


class _UpdateParams(_TaskIdParams):
    input_responses: dict[str, Any]


class _TaskRequest(McpRequest[_TaskIdParams, str]):
    name_param = "taskId"


class Ack(Result):
    """The empty acknowledgement of `tasks/update` and `tasks/cancel`."""

    model_config = ConfigDict(extra="allow")


async def _unresolved(created: CreatedTask, _ctx: ClaimContext) -> CallToolResult:
    raise AssertionError(f"call tasks with allow_claimed=True; got task {created.task_id}")


class TasksClientExtension(ClientExtension):
    """Declares the tasks extension on every request; the tests drive the task themselves."""

    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_unresolved)]


async def start_task(client: Client, tool: str, arguments: dict[str, Any]) -> CreatedTask:
    """Call `tool`; the server's answer must be a task."""
    answer = await client.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(answer, CreatedTask), f"{tool} answered inline: {answer}"
    return answer


async def get_task(client: Client, task_id: str) -> TaskState:
    request = _TaskRequest(method="tasks/get", params=_TaskIdParams(task_id=task_id))
    return await client.session.send_request(request, TaskState)


async def cancel_task(client: Client, task_id: str) -> Ack:
    request = _TaskRequest(method="tasks/cancel", params=_TaskIdParams(task_id=task_id))
    return await client.session.send_request(request, Ack)


async def update_task(client: Client, task_id: str, responses: dict[str, Any]) -> Ack:
    params = _UpdateParams(task_id=task_id, input_responses=responses)
    return await client.session.send_request(
        _TaskRequest(method="tasks/update", params=params), Ack
    )


async def wait_ended(client: Client, task_id: str, *, timeout_s: float) -> TaskState:
    """Poll `tasks/get` at the server's interval until the task ends (bounded by `timeout_s`)."""
    with anyio.fail_after(timeout_s):
        while True:
            state = await get_task(client, task_id)
            if state.status in ("completed", "failed", "cancelled"):
                return state
            await anyio.sleep((state.poll_interval_ms or 1000) / 1000)
