"""The server's way to the KV store: resolves the engine on first use and shares one client.

With `EPISTEMIC_GRAPH_KVCACHE_URL` (or `_ADDR`) set, that engine is used and nothing is ever
started, stopped or restarted. With nothing configured this is the embedded default, the managed
engine of the data dir:

- A session that uses it holds a lease (`engine_leases`) from first use until it exits. The last
  session to drop its lease stops an engine that sessions started; one started by
  `graph-kvcache-mcp engine start` runs until `engine stop`, and `--keep-engine` leaves it running.
- Self-healing: before each call the session checks, from the process side, that the engine its
  client points at is still the process recorded in the state file. When it is gone (killed,
  crashed, stopped from a shell) or the state file names another one (restarted on a new port),
  the state is read again and, if nothing runs, the engine is started again on the same store.
- Read-only sessions use an engine that already runs and create nothing: no engine, no lease,
  no secret, no directory.
- One deadline (`EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S`) bounds each call's wait for the engine, a
  restart included: the start (or restart) runs in a worker thread of its own and continues in
  the background, and a call whose deadline passes first answers `Unavailable` ("engine
  restarting") instead of waiting for it. Callers never queue behind one another past their own
  deadline; the next call after the restart uses the new engine.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.engine.opener import KvTarget, sync_client_for
from graph_kvcache_mcp.connectors.engine.process import (
    DEFAULT_READY_TIMEOUT_S,
    Backend,
    EngineState,
    EngineStatus,
    EngineStopResult,
    ManagedEngine,
)
from graph_kvcache_mcp.connectors.processes.identity import is_ours
from graph_kvcache_mcp.connectors.processes.lease_rules import SessionLease, stop_refusal
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError, GraphKvcacheError

log = logging.getLogger(__name__)

Source = Literal["configured", "managed"]

STOPPED_BY_TOOL = (
    "the managed engine was stopped with engine_stop; call engine_start to start it again"
)

StateStamp = tuple[int, int, int]
"""(inode, mtime in ns, size) of the state file: any rewrite of it changes the stamp."""


def read_only_reason(data_dir: Path) -> str:
    return (
        f"read-only: no engine runs for {data_dir}; start one with engine_start in a writable "
        "session or `graph-kvcache-mcp engine start`"
    )


@dataclass(frozen=True)
class AccessInfo:
    """Which engine the KV tools use, and what this server will do with it on exit."""

    source: Source
    base_url: str | None
    started_pid: int | None
    holds_lease: bool
    stops_on_exit: bool
    restarts: int


@dataclass(frozen=True)
class _Binding:
    """The managed engine the shared client points at, as the state file recorded it."""

    state: EngineState
    stamp: StateStamp | None


@dataclass
class _Restart:
    """A start of the managed engine running in a worker thread; its result is read once done."""

    lost: _Binding | None
    began: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    status: EngineStatus | None = None
    error: GraphKvcacheError | None = None
    outcome: KvClient | Unavailable | None = None
    """What every caller that waited for this restart gets, set by the first one to finish it."""

    @classmethod
    def begin(cls, start: Callable[[], EngineStatus], lost: _Binding | None) -> _Restart:
        restart = cls(lost)

        def run() -> None:
            try:
                restart.status = start()
            except GraphKvcacheError as exc:  # the engine's or a state path's own reason
                restart.error = exc
            except Exception as exc:
                restart.error = EngineProcessError(f"{type(exc).__name__}: {exc}")
            finally:
                restart.done.set()

        threading.Thread(target=run, name="engine-restart", daemon=True).start()
        return restart

    def pending_reason(self, waited_s: float) -> str:
        what = "restarting" if self.lost is not None else "starting"
        return (
            f"engine {what}: the managed engine has been starting for "
            f"{time.monotonic() - self.began:.1f} s and did not answer within this call's "
            f"{waited_s:g} s deadline (EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S); the start goes on in "
            "the background, try again shortly"
        )


class KvAccess:
    """One shared `KvClient` per server, plus this session's part in the engine's lifecycle."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = ManagedEngine(settings.data_dir)
        self._client: KvClient | None = None
        self._binding: _Binding | None = None
        self._lease = SessionLease(self.engine)
        self._started_pid: int | None = None
        self._restarts = 0
        self._stopped_by_tool = False
        self._restart: _Restart | None = None
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        base = self._client.base_url if self._client is not None else None
        return f"KvAccess(source={self.source!r}, base_url={base!r})"

    @property
    def source(self) -> Source:
        return "configured" if self.settings.kv_url is not None else "managed"

    @property
    def label(self) -> str:
        """Where KV calls go, for results that need a `base_url` before any client exists."""
        if self._client is not None:
            return self._client.base_url
        if self.settings.kv_url is not None:
            return self.settings.kv_url
        return f"managed engine in {self.engine.data_dir}"

    def info(self) -> AccessInfo:
        binding = self._binding
        runs_until_stop = binding is None or binding.state.runs_until_stop
        return AccessInfo(
            source=self.source,
            base_url=self._client.base_url if self._client is not None else self.settings.kv_url,
            started_pid=self._started_pid,
            holds_lease=self._lease.held,
            stops_on_exit=self._lease.held
            and not runs_until_stop
            and not self.settings.keep_engine,
            restarts=self._restarts,
        )

    async def connect(self, *, wait_s: float | None = None) -> KvClient | Unavailable:
        """The shared client; with nothing configured, reuse, start or restart the managed
        engine first (read-only: only reuse).

        Waits at most `wait_s` (default: the KV timeout) for the engine: a start that takes
        longer goes on in the background and this call answers `Unavailable` ("engine
        restarting"), as does a call that could not get its turn within that time.
        """
        client = self._client
        if client is not None and self._still_bound():
            return client
        budget_s = self.settings.kv_timeout_s if wait_s is None else wait_s
        deadline = time.monotonic() + budget_s
        outcome: KvClient | Unavailable | _Restart | None = None
        with anyio.move_on_after(budget_s):
            async with self._lock:
                outcome = await self._connect_locked()
        if outcome is None:
            restart = self._restart
            if restart is not None:
                return Unavailable(restart.pending_reason(budget_s))
            return Unavailable(
                f"engine busy: another call is using or starting the managed engine and this "
                f"call's {budget_s:g} s deadline passed first; try again shortly"
            )
        if not isinstance(outcome, _Restart):
            return outcome
        while not outcome.done.is_set():
            if time.monotonic() >= deadline:
                return Unavailable(outcome.pending_reason(budget_s))
            await anyio.sleep(0.02)
        if outcome.outcome is None:
            async with self._lock:  # short: no I/O but the binding and a new client
                await self._finish(outcome)
        assert outcome.outcome is not None  # set by _finish
        return outcome.outcome

    async def client(self) -> KvClient:
        """The shared client, for callers that cannot report `Unavailable` themselves.

        Raises:
            EngineProcessError: the embedded engine could not be started; says why.
        """
        outcome = await self.connect()
        if isinstance(outcome, Unavailable):
            raise EngineProcessError(outcome.reason)
        return outcome

    async def startup(self) -> None:
        """`--start-engine`: bring the embedded engine up now instead of on first use."""
        if not self.settings.start_engine:
            return
        if self.settings.kv_url is not None:
            log.warning("--start-engine ignored: EPISTEMIC_GRAPH_KVCACHE_URL is set")
            return
        outcome = await self.connect(wait_s=DEFAULT_READY_TIMEOUT_S + 5.0)
        if isinstance(outcome, Unavailable):
            log.warning("managed engine did not start: %s", outcome.reason)

    async def start_engine(
        self, *, backend: Backend | None = None, port: int | None = None, resp: bool = False
    ) -> EngineStatus:
        """Start (or reuse) the managed engine and point the shared client at it; `resp` opens
        its RESP wire too.

        Raises:
            EngineProcessError: a URL is configured, or the engine could not start.
        """
        self._refuse_when_configured("start")
        async with self._lock:
            status = await self._start_locked(backend=backend, port=port, resp=resp)
            self._stopped_by_tool = False
            return status

    async def stop_engine(self, *, force: bool = False) -> EngineStopResult:
        """Stop the managed engine now, when no one else relies on it (or when forced).

        Without `force` it refuses an engine started to run until `engine stop` and one that
        other live sessions hold leases on. This session drops its own lease either way.

        Raises:
            EngineProcessError: a URL is configured, or others rely on the engine and not forced.
        """
        self._refuse_when_configured("stop")
        async with self._lock:
            state = await anyio.to_thread.run_sync(self.engine.running_state)
            if state is None:
                await self._release_lease(stop_if_last=False)
                return EngineStopResult(
                    stopped=False, how="not_running", data_dir=str(self.engine.data_dir)
                )
            if not force and (refusal := await self._stop_refusal(state)) is not None:
                raise EngineProcessError(refusal)
            await self._drop_client()
            await self._release_lease(stop_if_last=False)
            result = await anyio.to_thread.run_sync(self.engine.stop)
            self._started_pid = None
            self._stopped_by_tool = True
            return result

    async def engine_status(self) -> EngineStatus:
        """The engine's status; stale records and leases are removed unless read-only."""
        tidy = not self.settings.read_only
        return await anyio.to_thread.run_sync(lambda: self.engine.status(tidy=tidy))

    async def aclose(self) -> None:
        """Close the client and drop this session's lease; the last session out stops an
        engine that sessions started (unless --keep-engine)."""
        # Runs at shutdown, often inside a cancelled scope: shield so the engine really stops.
        with anyio.CancelScope(shield=True):
            if (restart := self._restart) is not None:
                # A start still running would leave an engine no session holds: let it end.
                await anyio.to_thread.run_sync(restart.done.wait, DEFAULT_READY_TIMEOUT_S + 10)
                self._restart = None
            await self._drop_client()
            result = await self._release_lease(stop_if_last=not self.settings.keep_engine)
            if result is not None and result.stopped:
                log.info("stopped the managed engine (pid %s, %s)", result.pid, result.how)
            self._started_pid = None

    # --- internals ---------------------------------------------------------------------------

    def _still_bound(self) -> bool:
        """True when the client's engine is still the recorded, running process (no I/O but a
        stat of the state file and a read of /proc). Always true for a configured URL."""
        if self.settings.kv_url is not None:
            return True
        binding = self._binding
        return (
            binding is not None
            and _stamp(self.engine.state_path) == binding.stamp
            and is_ours(binding.state.process)
        )

    async def _connect_locked(self) -> KvClient | Unavailable | _Restart:
        if self.settings.kv_url is not None:
            if self._client is None:
                self._client = self._new_client(self.settings.kv_url, configured=True)
            return self._client
        if self._client is not None and self._still_bound():
            return self._client  # another task healed it while this one waited
        if self._stopped_by_tool:
            return Unavailable(STOPPED_BY_TOOL)
        if self.settings.read_only:
            return await self._attach_read_only()
        if self._restart is not None:
            if not self._restart.done.is_set() or self._restart.outcome is None:
                return self._restart  # one start at a time; its callers wait for it
            self._restart = None
        lost = self._binding
        backend = lost.state.backend if lost is not None else None
        resp = lost is not None and lost.state.resp_port is not None  # healed as it was
        # Taken before the start: a session exiting meanwhile sees this lease and leaves the
        # engine running (release and start are serialized on the engine's lock).
        await self._lease.take()
        self._restart = _Restart.begin(
            lambda: self.engine.start(
                backend=backend or self.settings.engine_backend,
                port=self.settings.engine_port,
                progress=lambda message: log.info("%s", message),
                runs_until_stop=False,
                resp=resp,
            ),
            lost,
        )
        return self._restart

    async def _finish(self, restart: _Restart) -> None:
        """Turn a finished start into what its callers get (under the lock, once)."""
        if restart.outcome is not None:
            return
        if self._restart is restart:
            self._restart = None
        if restart.error is not None:
            verb = "started" if isinstance(restart.error, EngineProcessError) else "used"
            restart.outcome = Unavailable(f"managed engine could not be {verb}: {restart.error}")
            return
        if self._stopped_by_tool:
            restart.outcome = Unavailable(STOPPED_BY_TOOL)
            return
        assert restart.status is not None  # set unless error
        try:
            restart.outcome = await self._adopt(restart.status)
        except EngineProcessError as exc:
            restart.outcome = Unavailable(f"managed engine could not be started: {exc}")
            return
        lost = restart.lost
        if lost is not None and restart.status.pid != lost.state.process.pid:
            self._restarts += 1
            how = "found it running again" if restart.status.reused else "started it again"
            log.warning(
                "the managed engine (pid %s) was gone; %s (pid %s, %s)",
                lost.state.process.pid,
                how,
                restart.status.pid,
                restart.status.base_url,
            )

    async def _attach_read_only(self) -> KvClient | Unavailable:
        """Use the engine that runs now, touching nothing on disk (no lease, no secret)."""

        def find() -> tuple[EngineState | None, StateStamp | None]:
            return self.engine.running_state(tidy=False), _stamp(self.engine.state_path)

        state, stamp = await anyio.to_thread.run_sync(find)
        token = await anyio.to_thread.run_sync(self.engine.existing_token)
        if state is None or token is None:
            await self._drop_client()
            self._binding = None
            return Unavailable(read_only_reason(self.engine.data_dir))
        if (impostor := await anyio.to_thread.run_sync(self.engine.impostor, state)) is not None:
            await self._drop_client()
            self._binding = None
            return Unavailable(impostor)
        self._bind(state, stamp)
        return await self._point_at(state.base_url)

    async def _start_locked(
        self, *, backend: Backend | None, port: int | None, resp: bool
    ) -> EngineStatus:
        # Taken before the start: a session exiting meanwhile sees this lease and leaves the
        # engine running (release and start are serialized on the engine's lock).
        await self._lease.take()
        status = await anyio.to_thread.run_sync(
            lambda: self.engine.start(
                backend=backend or self.settings.engine_backend,
                port=port or self.settings.engine_port,
                progress=lambda message: log.info("%s", message),
                runs_until_stop=False,
                resp=resp,
            )
        )
        await self._adopt(status)
        return status

    async def _adopt(self, status: EngineStatus) -> KvClient:
        """Point the shared client at the engine `start` returned and record its binding."""
        if not status.reused:
            self._started_pid = status.pid
        if status.base_url is None:  # start() only returns once the engine answers
            raise EngineProcessError(f"engine started but reports no address: {status.reason}")

        def recorded() -> tuple[EngineState | None, StateStamp | None]:
            return self.engine.state(), _stamp(self.engine.state_path)

        state, stamp = await anyio.to_thread.run_sync(recorded)
        if state is not None:
            self._bind(state, stamp)
        return await self._point_at(status.base_url)

    def _bind(self, state: EngineState, stamp: StateStamp | None) -> None:
        self._binding = _Binding(state, stamp)

    async def _point_at(self, base_url: str) -> KvClient:
        if self._client is None or self._client.base_url != base_url:
            await self._drop_client()
            self._client = self._new_client(base_url, configured=False)
        return self._client

    def _new_client(self, base_url: str, *, configured: bool) -> KvClient:
        target = (
            KvTarget(base_url, self.settings.kv_token, "configured")
            if configured
            else KvTarget(
                base_url,
                self.engine.existing_token(),
                "managed",
                # The state records the backend, so key limits need no stats call to learn it.
                self._binding.state.backend if self._binding is not None else None,
            )
        )
        return KvClient(sync_client_for(target, self.settings))

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _release_lease(self, *, stop_if_last: bool) -> EngineStopResult | None:
        self._binding = None
        return await self._lease.release(stop_if_last=stop_if_last)

    async def _stop_refusal(self, state: EngineState) -> str | None:
        return stop_refusal(
            state,
            await self._lease.others(),
            what=f"the engine in {self.engine.data_dir}",
            stop_command="graph-kvcache-mcp engine stop",
            afterwards=" (a session still using it starts it again on its next KV call)",
        )

    def _refuse_when_configured(self, verb: str) -> None:
        if self.settings.kv_url is not None:
            raise EngineProcessError(
                f"this server uses the engine at {self.settings.kv_url} "
                "(EPISTEMIC_GRAPH_KVCACHE_URL/ADDR is set) and never starts or stops engines; "
                f"to {verb} the local managed engine, run the server without that variable"
            )


def _stamp(path: Path) -> StateStamp | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)
