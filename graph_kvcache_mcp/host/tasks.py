"""Long tool calls as MCP tasks: the `io.modelcontextprotocol/tasks` extension, served for real.

The wire contract followed is the extension's specification (modelcontextprotocol/ext-tasks,
`specification/draft/tasks.md`, for MCP 2026-07-28). A client opts in per request, in the
`_meta` client capabilities of its `tools/call`; for a tool that `runs_as_task` names, the
server then answers at once with the task (`resultType: "task"`) and runs the call in the
background here. `tasks/get` answers the task as it stands (its last progress message while
working; the tool's result, or the protocol error, once ended), `tasks/update` is acknowledged
(no tool here asks for input), `tasks/cancel` stops the work. A client that does not opt in, or
a legacy (2025) connection, gets the call inline as before. SDK 2.3 alone answers a task "born
terminal" (the tool runs inline); this runner is why the task outlives the request.

The book (`task_book.TaskBook`) lives as long as this runner: the server process over stdio,
the HTTP server over HTTP (a new HTTP session can `tasks/get` a task an earlier one opened), and
it is bounded (`ttl_s`, `max_tasks`). Background calls run in the task group `serving` opens
inside the server's lifespan, so they end with it.

Cancelling: the call's cancel scope is cancelled, and the next progress report of the call
raises `TaskCancelled` (a tool that waits in a worker thread, as a vLLM start does, cannot be
reached by cancellation; its progress callback can, and the vLLM start stops what it spawned).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, cast

import anyio
from anyio.abc import TaskGroup
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.server import require_client_extension
from mcp.server.session import ServerSession
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, CallToolRequestParams, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

from graph_kvcache_mcp.host.task_book import POLL_INTERVAL_S, BookFull, TaskBook, TaskRecord

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
log = logging.getLogger(__name__)


class TaskCancelled(ToolError):
    """Raised into a cancelled task's work at its next progress report (a `ToolError`: an
    expected end of the call, logged as such, not as a crash)."""


class TaskParams(RequestParams):
    """Params of `tasks/get` and `tasks/cancel`."""

    task_id: str = Field(min_length=1, max_length=200)


class TaskUpdateParams(TaskParams):
    """Params of `tasks/update`: responses to the task's input requests (none are asked here)."""

    input_responses: dict[str, Any] | None = None


class TaskRunner(Extension):
    """The tasks extension: which calls become tasks, the book, and the background runner."""

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        runs_as_task: Callable[[str], bool],
        book: TaskBook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._runs_as_task = runs_as_task
        self.book = book or TaskBook()
        self._clock = clock
        self._groups: list[TaskGroup] = []
        self._scopes: dict[str, anyio.CancelScope] = {}

    # --- what the extension contributes ---------------------------------------------------

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskParams, self._get, protocol_versions=modern),
            MethodBinding("tasks/update", TaskUpdateParams, self._update, protocol_versions=modern),
            MethodBinding("tasks/cancel", TaskParams, self._cancel, protocol_versions=modern),
        ]

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if not self._groups or not opted_in(ctx) or not self._runs_as_task(params.name):
            return await call_next(ctx)
        task_id = secrets.token_urlsafe(18)  # unguessable: any HTTP session may ask by id
        try:
            record = self.book.open(task_id, params.name, self._clock())
        except BookFull as full:
            log.warning("%s; %s runs inline", full, params.name)
            return await call_next(ctx)
        session = cast(ServerSession, _TaskSession(ctx.session, self, task_id))
        self._groups[-1].start_soon(self._run, record, replace(ctx, session=session), call_next)
        return {**self.wire(record), "resultType": "task"}

    # --- the runner ---------------------------------------------------------------------------

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Run background calls while inside; on leaving, cancel the ones still working."""
        async with anyio.create_task_group() as group:
            self._groups.append(group)
            try:
                yield
            finally:
                self._groups.remove(group)
                for task_id in list(self._scopes):
                    self.cancel(task_id)

    def cancel(self, task_id: str) -> None:
        self.book.ask_cancel(task_id, self._clock())
        if (scope := self._scopes.get(task_id)) is not None:
            scope.cancel()

    def progress(
        self, task_id: str, progress: float, total: float | None, message: str | None
    ) -> None:
        """Record a report of the call behind `task_id`.

        Raises:
            TaskCancelled: the task was cancelled, so its work stops here.
        """
        record = self.book.find(task_id, self._clock())
        if record is not None and record.cancel_requested:
            raise TaskCancelled(f"the client cancelled task {task_id}")
        of = f"{round(progress, 1):g}" + (f"/{round(total, 1):g}" if total else "")
        self.book.note(task_id, f"{message} ({of})" if message else of, self._clock())

    async def _run(
        self, record: TaskRecord, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> None:
        result: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        with anyio.CancelScope() as scope:
            self._scopes[record.task_id] = scope
            if record.cancel_requested:  # cancelled before this started
                scope.cancel()
            try:
                outcome = await call_next(ctx)
                result = _as_json(outcome)
            except MCPError as exc:
                error = exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)
            except Exception:
                log.exception("task %s (%s) raised", record.task_id, record.tool)
                error = {"code": INTERNAL_ERROR, "message": "the call raised (see the server log)"}
            finally:
                self._scopes.pop(record.task_id, None)
        if scope.cancelled_caught:
            self.book.ask_cancel(record.task_id, self._clock())
        self.book.end(record.task_id, self._clock(), result=result, error=error)

    # --- the methods --------------------------------------------------------------------------

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        return self.wire(self._known(ctx, params.task_id))

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams
    ) -> dict[str, Any]:
        self._known(ctx, params.task_id)
        return {}  # no tool of this server asks for input: nothing is outstanding

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> dict[str, Any]:
        self.cancel(self._known(ctx, params.task_id).task_id)
        return {}

    def _known(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> TaskRecord:
        require_client_extension(ctx, TASKS_EXTENSION)
        record = self.book.find(task_id, self._clock())
        if record is None:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"no task {task_id[:60]!r} on this server: it was never opened here, "
                f"or it ended over {self.book.ttl_s:g} s ago and was dropped, or the server "
                "restarted. Call the tool again",
                data={"taskId": task_id[:60]},
            )
        return record

    def wire(self, record: TaskRecord) -> dict[str, Any]:
        """`record` as the extension's task object (with its result or error once ended)."""
        out: dict[str, Any] = {
            "taskId": record.task_id,
            "status": record.status,
            "createdAt": _iso(record.created_at),
            "lastUpdatedAt": _iso(record.updated_at),
            "ttlMs": round(self.book.ttl_s * 1000),
            "pollIntervalMs": round(POLL_INTERVAL_S * 1000),
        }
        if record.status_message is not None:
            out["statusMessage"] = record.status_message
        if record.status == "completed":
            out["result"] = record.result
        if record.status == "failed":
            out["error"] = record.error
        return out


def opted_in(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the tasks extension (a 2026-07-28 request)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(
        capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions
    )


class _TaskSession:
    """The request's session for a call that runs as a task: its progress goes to the task
    (the request has been answered; there is no one to notify), all else to the session."""

    def __init__(self, inner: ServerSession, runner: TaskRunner, task_id: str) -> None:
        self._inner = inner
        self._runner = runner
        self._task_id = task_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        self._runner.progress(self._task_id, progress, total, message)


def _as_json(outcome: HandlerResult) -> dict[str, Any]:
    if isinstance(outcome, BaseModel):
        return outcome.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(cast(dict[str, Any], outcome or {}))


def _iso(epoch_s: float) -> str:
    return (
        datetime.fromtimestamp(epoch_s, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
