"""Running one call's requests on lanes of its own, under the call's one deadline.

A batch runs on at most `lanes` concurrent lanes that take the next input as they free up; no
lane is shared with another call, so a call never waits behind another call's requests. Inputs no
lane reached by the deadline come back as `timed_out(deadline)`. Each request already ends at the
deadline by itself (`engine_wire`); the waits here only add a short grace for scheduling.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor, wait
from itertools import count
from typing import TypeVar

import anyio

from graph_kvcache_mcp.connectors.engine.wire import Deadline
from graph_kvcache_mcp.domain.outcomes import Unavailable

LANE_GRACE_S = 0.25
"""How long past its deadline a batch waits for its lanes to hand back (their sockets time out
at the deadline itself; this only covers scheduling)."""

R = TypeVar("R")
T = TypeVar("T")
TimedOut = Callable[[Deadline], Unavailable]


def run_lanes(
    pool: ThreadPoolExecutor,
    operation: Callable[[T], R],
    inputs: list[T],
    *,
    lanes: int,
    deadline: Deadline,
    timed_out: TimedOut,
) -> list[R | Unavailable]:
    """`operation` over `inputs` on up to `lanes` threads: the calling thread runs one lane, the
    others run on `pool`; a helper lane still queued behind other calls at the deadline is
    dropped. Results in input order."""
    if len(inputs) <= 1:
        return [operation(item) for item in inputs]
    results: list[R | Unavailable | None] = [None] * len(inputs)
    cursor = count()  # next() on itertools.count is atomic under the GIL: lanes share it

    def lane() -> None:
        while (index := next(cursor)) < len(inputs):
            if deadline.remaining_s() <= 0:
                results[index] = timed_out(deadline)
            else:
                results[index] = operation(inputs[index])

    helpers = [pool.submit(lane) for _ in range(min(lanes, len(inputs)) - 1)]
    lane()
    _, late = wait(helpers, timeout=max(0.0, deadline.remaining_s()) + LANE_GRACE_S)
    for future in late:
        future.cancel()
    return [timed_out(deadline) if result is None else result for result in results]


async def gather_lanes(
    operation: Callable[[T], Awaitable[R]],
    inputs: list[T],
    *,
    lanes: int,
    deadline: Deadline,
    timed_out: TimedOut,
) -> list[R | Unavailable]:
    """`operation` over `inputs` on up to `lanes` tasks. Results in input order."""
    if len(inputs) == 1:  # a single request keeps to the deadline by itself: no task group
        return [await operation(inputs[0])]
    results: list[R | Unavailable | None] = [None] * len(inputs)
    pending = iter(range(len(inputs)))  # lanes share it: one event loop, no lock needed

    async def lane() -> None:
        for index in pending:
            results[index] = await operation(inputs[index])

    # The scope only guards against a stage that does not keep to the deadline by itself (a
    # worker thread on the TLS path); then every open slot times out.
    with anyio.move_on_after(max(0.0, deadline.remaining_s()) + LANE_GRACE_S):
        async with anyio.create_task_group() as group:
            for _ in range(min(lanes, len(inputs))):
                group.start_soon(lane)
    return [timed_out(deadline) if result is None else result for result in results]
