"""The server session's part in the managed `lmcache server`'s lifecycle: its lease.

A session that starts the server (`lmcache_start`), or reuses one that runs, holds a lease
(`engine_leases`, under `<data dir>/lmcache/leases/`) until `lmcache_stop` or exit. The last
session to drop its lease stops a server that sessions started; one started by
`graph-kvcache-mcp lmcache start` runs until `lmcache stop`, and `--keep-engine` leaves it
running. Read-only sessions only report: no lease, no tidying, nothing written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.connectors.lmcache.process import DEFAULT_READY_TIMEOUT_S, ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import (
    LmcacheState,
    LmcacheStatus,
    LmcacheStopResult,
    RespPeer,
)
from graph_kvcache_mcp.connectors.processes.lease_rules import SessionLease, stop_refusal
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec
from graph_kvcache_mcp.errors import LmcacheProcessError

log = logging.getLogger(__name__)


class LmcacheAccess:
    """This session's lease on the data dir's managed `lmcache server`."""

    def __init__(
        self, settings: Settings, *, dependents: Callable[[LmcacheState], str | None] | None = None
    ) -> None:
        self.settings = settings
        self.managed = ManagedLmcache(settings.data_dir, python=lmcache_python(settings))
        self.dependents = dependents
        """Why the server must outlive this session (a vLLM uses it), else None."""
        self._lease = SessionLease(self.managed)
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"LmcacheAccess({str(self.managed.data_dir)!r}, holds_lease={self.holds_lease})"

    @property
    def holds_lease(self) -> bool:
        return self._lease.held

    async def start(
        self,
        server: ProcessSpec,
        *,
        env: Mapping[str, str],
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        resp_peer: RespPeer | None = None,
    ) -> LmcacheStatus:
        """Start the planned server (or reuse the running one) and hold a lease on it.
        `resp_peer`: the engine process a `resp` L2 adapter connects to (`stack.resp`).

        Raises:
            LmcacheProcessError: as `ManagedLmcache.start`; a lease this call took is dropped.
        """
        async with self._lock:
            # Taken before the start: a session exiting meanwhile sees this lease and leaves the
            # server running (release and start are serialized on the server's lock).
            took = await self._lease.take()
            try:
                return await anyio.to_thread.run_sync(
                    lambda: self.managed.start(
                        server,
                        env=env,
                        ready_timeout_s=ready_timeout_s,
                        runs_until_stop=False,
                        resp_peer=resp_peer,
                    )
                )
            except Exception:  # cancelled, the start may have worked: keep the lease until exit
                if took:
                    await self._lease.release(stop_if_last=False)
                raise

    async def stop(self, *, force: bool = False, term_wait_s: float = 15.0) -> LmcacheStopResult:
        """Stop the server now, when no one else relies on it (or when forced).

        Without `force` it refuses a server started to run until `lmcache stop` and one that
        other live sessions hold leases on. This session drops its own lease either way.

        Raises:
            LmcacheProcessError: others rely on the server and `force` is false.
        """
        async with self._lock:
            state = await anyio.to_thread.run_sync(self.managed.running_state)
            refusal = None
            if state is not None and not force:
                refusal = stop_refusal(
                    state,
                    await self._lease.others(),
                    what=f"the lmcache server of {self.managed.data_dir}",
                    stop_command="graph-kvcache-mcp lmcache stop",
                    afterwards=" (vLLM instances connected to it lose their LMCache tier)",
                )
            held = self._lease.held
            await self._lease.release(stop_if_last=False)
            if refusal is not None:
                dropped = " This session no longer holds a lease on it." if held else ""
                raise LmcacheProcessError(f"{refusal}.{dropped}")
            return await anyio.to_thread.run_sync(
                lambda: self.managed.stop(term_wait_s=term_wait_s)
            )

    async def status(self) -> LmcacheStatus:
        """The server's status; stale records and leases are removed unless read-only."""
        tidy = not self.settings.read_only
        return await anyio.to_thread.run_sync(lambda: self.managed.status(tidy=tidy))

    async def aclose(self) -> None:
        """Drop this session's lease; the last session out stops a server that sessions
        started (unless --keep-engine)."""
        # Runs at shutdown, often inside a cancelled scope: shield so the server really stops.
        with anyio.CancelScope(shield=True):
            stop = not self.settings.keep_engine
            state = None
            if stop and self._lease.held:
                state = await anyio.to_thread.run_sync(self.managed.running_state)
                why = None if state is None or self.dependents is None else self.dependents(state)
                if why is not None:
                    log.warning("left the lmcache server running: %s", why)
                    stop = False
            result = await self._lease.release(stop_if_last=stop)
            if result is not None and result.stopped and state is not None:
                # the managed coordinator it joined ran for it: it goes with the server
                coordinator = ManagedCoordinator(self.settings.data_dir)
                await anyio.to_thread.run_sync(
                    coordinator.stop_if_joined, state.wiring.coordinator_url
                )
        if result is not None and result.stopped:
            log.info("stopped the managed lmcache server (pid %s, %s)", result.pid, result.how)


def lmcache_python(settings: Settings) -> Path | None:
    """The interpreter that runs `lmcache server`: GRAPH_KVCACHE_LMCACHE_PYTHON, else vLLM's
    (LMCache's MP connector needs LMCache in vLLM's venv anyway), else this one."""
    return settings.lmcache_python or settings.vllm_python
