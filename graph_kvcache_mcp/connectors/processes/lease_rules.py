"""The rules leases put on a managed process, shared by the engine and the `lmcache server`.

A process started by a server session (`runs_until_stop` false) stops when the last live lease
on it is dropped; one started from the CLI runs until its `stop` command. A session's own stop
is refused, unless forced, while other sessions hold leases or when the CLI started it. The
managers call `release_lease` under their lifecycle lock; a session keeps its `SessionLease`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import anyio.to_thread
from pydantic import Field

from graph_kvcache_mcp.connectors.processes.leases import Leases
from graph_kvcache_mcp.connectors.processes.state_file import ProcessState, StateFile

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
LeasedT = TypeVar("LeasedT", bound="LeasedState")


class LeasedState(ProcessState):
    """A state file's model for a process that server sessions hold leases on."""

    runs_until_stop: bool = Field(
        True,
        description="Started from the CLI (or a library caller): only its `stop` ends it. "
        "False: started by a server session; the last session to drop its lease stops it.",
    )


def keep_until_stop(state_file: StateFile[LeasedT], state: LeasedT) -> LeasedT:
    """Mark a session-started process to run until its `stop` (a CLI `start` reused it)."""
    if state.runs_until_stop:
        return state
    kept = state.model_copy(update={"runs_until_stop": True})
    state_file.write(kept)
    return kept


def release_lease(
    leases: Leases,
    lease: Path,
    *,
    stop_if_last: bool,
    running: Callable[[], LeasedState | None],
    stop: Callable[[], R],
) -> R | None:
    """Drop `lease`; `stop()` when it was the last live lease, the process was started by a
    session and `stop_if_last` allows it. Call under the manager's lifecycle lock.

    Returns what `stop()` returned when it ran, else None.
    """
    leases.drop(lease)
    if not stop_if_last or leases.live():
        return None
    state = running()
    if state is None or state.runs_until_stop:
        return None
    return stop()


def stop_refusal(
    state: LeasedState, others: list[int], *, what: str, stop_command: str, afterwards: str = ""
) -> str | None:
    """Why a session may not stop `what` without force, or None when it may.

    `stop_command` is the CLI line that stops it; `afterwards` says what sessions still using it
    will do once it is stopped.
    """
    if state.runs_until_stop:
        return (
            f"{what} (pid {state.process.pid}) was not started by a server session: it was "
            f"started from the CLI (or by a library caller) and runs until `{stop_command}`; "
            "pass force=true to stop it anyway"
        )
    if others:
        pids = ", ".join(str(pid) for pid in others)
        return (
            f"{what} (pid {state.process.pid}) is in use by {len(others)} other server "
            f"session(s) (pid {pids}); it stops by itself when the last of them exits. Pass "
            f"force=true to stop it now{afterwards}"
        )
    return None


class LeasedLifecycle(Generic[R]):
    """`stop` and `release` for a manager whose process server sessions hold leases on.

    The manager supplies `leases`, `running_state`, `_exclusive` (its lifecycle lock) and
    `_stop` (the signalling, under that lock), and sets `TERM_WAIT_S`.
    """

    TERM_WAIT_S: float
    leases: Leases

    def running_state(self, *, tidy: bool = True) -> LeasedState | None:
        raise NotImplementedError

    def _exclusive(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _stop(self, term_wait_s: float) -> R:
        raise NotImplementedError

    def stop(self, *, term_wait_s: float | None = None) -> R:
        """SIGTERM the process we started (its process group), SIGKILL after `term_wait_s`;
        never anything else."""
        with self._exclusive():
            return self._stop(self.TERM_WAIT_S if term_wait_s is None else term_wait_s)

    def release(self, lease: Path, *, stop_if_last: bool) -> R | None:
        """Drop a session's lease; stop the process when that was the last live lease, it was
        started by a session (not to run until its `stop` command) and `stop_if_last` allows it.

        Returns the stop's result when the process was stopped, else None.
        """
        with self._exclusive():
            return release_lease(
                self.leases,
                lease,
                stop_if_last=stop_if_last,
                running=self.running_state,
                stop=lambda: self._stop(self.TERM_WAIT_S),
            )


class LeasedManager(Protocol[R_co]):
    """A manager whose process server sessions hold leases on."""

    @property
    def leases(self) -> Leases: ...

    def release(self, lease: Path, *, stop_if_last: bool) -> R_co | None: ...


class SessionLease(Generic[R]):
    """This server session's one lease on a managed process, taken before a start so that a
    session exiting meanwhile leaves the process running."""

    def __init__(self, manager: LeasedManager[R]) -> None:
        self.manager = manager
        self.path: Path | None = None

    def __repr__(self) -> str:
        return f"SessionLease({self.path!r})"

    @property
    def held(self) -> bool:
        return self.path is not None

    async def take(self) -> bool:
        """Take the lease unless this session holds it; True when this call took it."""
        if self.path is not None:
            return False
        self.path = await anyio.to_thread.run_sync(self.manager.leases.take)
        return True

    async def release(self, *, stop_if_last: bool) -> R | None:
        """Drop the lease (when held); the manager stops the process when this was the last."""
        path, self.path = self.path, None
        if path is None:
            return None
        return await anyio.to_thread.run_sync(
            lambda: self.manager.release(path, stop_if_last=stop_if_last)
        )

    async def others(self) -> list[int]:
        """The pids of the other live sessions holding leases."""
        live = await anyio.to_thread.run_sync(self.manager.leases.live)
        return sorted({lease.pid for path, lease in live.items() if path != self.path})
