"""Progress notifications while a tool waits on something that may not answer.

A client that asked for progress (a `progressToken`) hears, every `PROGRESS_EVERY_S`, how long
the call has waited, its bound and the variable that sets that bound, so a stuck server never
reads as a silent hang. A client that did not ask hears nothing (the SDK drops the reports).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver import Context

PROGRESS_EVERY_S = 2.0
"""A wait shorter than this sends nothing; a longer one a note this often."""

T = TypeVar("T")


async def with_progress(
    ctx: Context[Any],
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    bound_s: float,
    knob: str,
    every_s: float = PROGRESS_EVERY_S,
) -> T:
    """`await call()`, reporting progress on `ctx` every `every_s` until it returns.

    `bound_s` is the most the call can wait (its deadline), set by the variable `knob`.
    """

    async def beat() -> None:
        began = anyio.current_time()
        while True:
            await anyio.sleep(every_s)
            waited = anyio.current_time() - began
            await ctx.report_progress(
                waited,  # MCP progress must grow, so not capped at the total
                total=bound_s if waited < bound_s else None,
                message=f"{what}: waited {waited:.0f} s of at most {bound_s:g} s ({knob})",
            )

    results: list[T] = []
    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(beat)
        try:
            results.append(await call())
        except Exception as exc:  # re-raised below as itself, not inside an exception group
            failure = exc
        group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return results[0]
