"""Serving over stdio: until stdin closes, a signal arrives or the client stops reading.

SIGTERM/SIGHUP/SIGINT end the server through its lifespan, so a managed engine it started is
stopped (or kept with --keep-engine), and the exit is 0 each way.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import sys
from typing import TYPE_CHECKING, Protocol, TypeVar

import anyio

if TYPE_CHECKING:
    from graph_kvcache_mcp.host.strict_server import StrictServer


class ClosesOnExit(Protocol):
    """What stdio needs of the lifespan's state (the composition root's `AppState`): an event
    set once its cleanup (stopping a managed engine) is done."""

    closed: anyio.Event


State = TypeVar("State", bound=ClosesOnExit)

SIGNAL_CLEANUP_S = 30.0
"""How long a signalled stdio server waits for its cleanup (stopping its engine) before exiting."""


CLIENT_GONE = "the client closed its end of stdout; shutting down"


async def serve_stdio(server: StrictServer[State]) -> None:
    """Serve until stdin closes, a signal arrives or the client stops reading stdout (it was
    killed); each way the lifespan cleans up (a managed engine is stopped) and the exit is 0."""
    watched = _client_pipe()
    leaving: list[str] = []
    async with anyio.create_task_group() as group:

        async def leave(why: str | None) -> None:
            if leaving:
                return
            leaving.append(why or "signal")
            if why is not None:
                logging.getLogger(__name__).warning("%s", why)
            group.cancel_scope.cancel()
            # The SDK reads stdin in a worker thread that only a line or EOF can wake, so the
            # task group would wait for it forever. Wait for the lifespan's cleanup (engine
            # stopped), then leave without that thread.
            state = server.live_state()
            if state is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(SIGNAL_CLEANUP_S):
                    await state.closed.wait()
            sys.stderr.flush()
            os._exit(0)

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as sigs:
                async for _ in sigs:
                    break
            await leave(None)

        async def stop_when_the_client_is_gone(fd: int) -> None:
            # A pipe's write end turns "readable" only when its reader has closed it.
            await anyio.wait_readable(fd)
            await leave(CLIENT_GONE)

        group.start_soon(stop_on_signal)
        if watched is not None:
            group.start_soon(stop_when_the_client_is_gone, watched)
        try:
            await server.run_stdio_async()
        except* (BrokenPipeError, ConnectionResetError):
            await leave(CLIENT_GONE)  # an answer found the pipe closed first
        group.cancel_scope.cancel()


def _client_pipe() -> int | None:
    """A duplicate of stdout to watch, when it is a pipe (what hosts give), taken before the SDK
    points fd 1 elsewhere; None for a file or terminal, which has no reader to lose."""
    try:
        if not stat.S_ISFIFO(os.fstat(1).st_mode):
            return None
        return os.dup(1)
    except OSError:
        return None
