"""The book of MCP tasks (the `io.modelcontextprotocol/tasks` extension): each task's state
machine and the bounds of the book. Pure: the caller passes the time (epoch seconds) and the id.

A task is `working` until it ends `completed` (the tool's result, a tool error included),
`failed` (a protocol error) or `cancelled`; a terminal task never changes again. The book is
bounded twice: a terminal task is dropped once `ttl_s` has passed since it was created, and it
holds at most `max_tasks` (the oldest terminal task makes room; when every task still works,
`open` refuses, and the caller runs the call inline instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

TaskStatus = Literal["working", "completed", "failed", "cancelled"]
TERMINAL: frozenset[TaskStatus] = frozenset({"completed", "failed", "cancelled"})

DEFAULT_TTL_S = 3600.0
"""How long a task is kept after it was created, once it has ended: an hour to fetch a result."""
DEFAULT_MAX_TASKS = 64
"""The most tasks one server keeps (working and ended together)."""
POLL_INTERVAL_S = 2.0
"""What the server suggests between two `tasks/get` (a vLLM start reports every 5 s)."""


class BookFull(Exception):
    """Every task in the book is still working: no room for one more."""


@dataclass
class TaskRecord:
    """One task: what it runs, where it stands, and (once ended) its outcome."""

    task_id: str
    tool: str
    created_at: float
    updated_at: float
    status: TaskStatus = "working"
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    cancel_requested: bool = False

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL


@dataclass
class TaskBook:
    """The tasks of one server process, bounded by `ttl_s` and `max_tasks` (see module)."""

    ttl_s: float = DEFAULT_TTL_S
    max_tasks: int = DEFAULT_MAX_TASKS
    _tasks: dict[str, TaskRecord] = field(default_factory=dict)

    def open(self, task_id: str, tool: str, now: float) -> TaskRecord:
        """A new working task for a call of `tool`.

        Raises:
            BookFull: `max_tasks` tasks are all still working.
        """
        self.purge(now)
        if len(self._tasks) >= self.max_tasks:
            oldest = min((t for t in self._tasks.values() if t.ended), default=None, key=_age)
            if oldest is None:
                raise BookFull(f"{self.max_tasks} tasks are still working on this server")
            del self._tasks[oldest.task_id]
        record = TaskRecord(
            task_id,
            tool,
            created_at=now,
            updated_at=now,
            status_message=f"{tool} is running",
        )
        self._tasks[task_id] = record
        return record

    def find(self, task_id: str, now: float) -> TaskRecord | None:
        """The task `task_id`, or None when it is unknown or has expired."""
        self.purge(now)
        return self._tasks.get(task_id)

    def purge(self, now: float) -> None:
        """Drop every ended task older than `ttl_s`."""
        expired = [t.task_id for t in self._tasks.values() if t.ended and _expired(t, self, now)]
        for task_id in expired:
            del self._tasks[task_id]

    def note(self, task_id: str, message: str, now: float) -> None:
        """A working task's latest progress (ignored once it has ended)."""
        if (task := self._tasks.get(task_id)) is not None and not task.ended:
            task.status_message = message
            task.updated_at = now

    def ask_cancel(self, task_id: str, now: float) -> None:
        """Record the client's wish to cancel (the runner stops the work, then `end`s it)."""
        if (task := self._tasks.get(task_id)) is not None and not task.ended:
            task.cancel_requested = True
            task.status_message = f"cancelling {task.tool}"
            task.updated_at = now

    def end(
        self,
        task_id: str,
        now: float,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """End a working task: `cancelled` when cancel was asked for and the work did not
        complete without error, else `failed` with `error`, else `completed` with `result`."""
        task = self._tasks.get(task_id)
        if task is None or task.ended:
            return
        task.updated_at = now
        succeeded = result is not None and not result.get("isError", False)
        if task.cancel_requested and not succeeded:
            task.status, task.status_message = "cancelled", f"{task.tool} was cancelled"
        elif error is not None:
            task.status, task.error = "failed", error
            task.status_message = f"{task.tool} failed: {error.get('message', 'an error')}"
        else:
            task.status, task.result = "completed", result or {}
            task.status_message = f"{task.tool} finished" + (
                " with an error" if result and result.get("isError") else ""
            )


def _age(task: TaskRecord) -> float:
    return task.created_at


def _expired(task: TaskRecord, book: TaskBook, now: float) -> bool:
    return now - task.created_at >= book.ttl_s
