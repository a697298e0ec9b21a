"""The managed policy of `KvAccess`: the data dir's engine, leased, healed and started on demand.

Used when nothing is configured (the embedded default):

- A session that uses it holds a lease (`processes/leases`) from first use until it exits. The
  last session to drop its lease stops an engine that sessions started; one started by
  `graph-kvcache-mcp engine start` runs until `engine stop`, and `--keep-engine` leaves it running.
- Self-healing: before each call the session checks, from the process side, that the engine its
  client points at is still the process recorded in the state file. When it is gone (killed,
  crashed, stopped from a shell) or the state file names another one (restarted on a new port),
  the state is read again and, if nothing runs, the engine is started again on the same store.
- Read-only sessions use an engine that already runs and create nothing: no engine, no lease,
  no secret, no directory.
- One deadline (`EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S`) bounds each call's wait for the engine, a
  restart included: the start (or restart) runs in a worker thread of its own
  (`restart.EngineRestart`) and continues in the background, and a call whose deadline passes
  first answers `Unavailable` ("engine restarting") instead of waiting for it. Callers never
  queue behind one another past their own deadline; the next call after the restart uses the
  new engine.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import anyio
import anyio.to_thread
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.access import AccessInfo, KvAccess, Source
from graph_kvcache_mcp.connectors.engine.children.dependents import dependents_refusal
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.engine.opener import KvTarget, sync_client_for
from graph_kvcache_mcp.connectors.engine.process import DEFAULT_READY_TIMEOUT_S, ManagedEngine
from graph_kvcache_mcp.connectors.engine.restart import Binding, EngineRestart, StateStamp
from graph_kvcache_mcp.connectors.engine.state import (
    Backend,
    EngineState,
    EngineStatus,
    EngineStopResult,
)
from graph_kvcache_mcp.connectors.processes.identity import is_ours
from graph_kvcache_mcp.connectors.processes.lease_rules import SessionLease, stop_refusal
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError

log = logging.getLogger(__name__)

STOPPED_BY_TOOL = (
    "the managed engine was stopped with engine_stop; call engine_start to start it again"
)


def read_only_reason(data_dir: Path) -> str:
    return (
        f"read-only: no engine runs for {data_dir}; start one with engine_start in a writable "
        "session or `graph-kvcache-mcp engine start`"
    )


class ManagedKvAccess(KvAccess):
    """The managed engine of the data dir, with this session's lease on it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = ManagedEngine(settings.data_dir)
        self._client: KvClient | None = None
        self._client_token: SecretStr | None = None
        self._binding: Binding | None = None
        self._lease = SessionLease(self.engine)
        self._started_pid: int | None = None
        self._restarts = 0
        self._stopped_by_tool = False
        self._restart: EngineRestart | None = None
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        base = self._client.base_url if self._client is not None else None
        return f"ManagedKvAccess(data_dir={str(self.engine.data_dir)!r}, base_url={base!r})"

    @property
    def source(self) -> Source:
        return "managed"

    @property
    def label(self) -> str:
        if self._client is not None:
            return self._client.base_url
        return f"managed engine in {self.engine.data_dir}"

    def info(self) -> AccessInfo:
        binding = self._binding
        runs_until_stop = binding is None or binding.state.runs_until_stop
        return AccessInfo(
            source="managed",
            base_url=self._client.base_url if self._client is not None else None,
            started_pid=self._started_pid,
            holds_lease=self._lease.held,
            stops_on_exit=self._lease.held
            and not runs_until_stop
            and not self.settings.keep_engine,
            restarts=self._restarts,
        )

    def token(self) -> SecretStr | None:
        return self.engine.token()

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
        outcome: KvClient | Unavailable | EngineRestart | None = None
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
        if not isinstance(outcome, EngineRestart):
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

    async def startup(self) -> None:
        if not self.settings.start_engine:
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
            EngineProcessError: the engine could not start.
        """
        async with self._lock:
            status = await self._start_locked(backend=backend, port=port, resp=resp)
            self._stopped_by_tool = False
            return status

    async def stop_engine(self, *, force: bool = False) -> EngineStopResult:
        """Stop the managed engine now, when no one else relies on it (or when forced).

        Without `force` it refuses an engine started to run until `engine stop` and one that
        other live sessions hold leases on. This session drops its own lease either way.

        Raises:
            EngineProcessError: others rely on the engine and `force` is not set.
        """
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
        stat of the state file and a look at the process)."""
        binding = self._binding
        return (
            binding is not None
            and _stamp(self.engine.state_path) == binding.stamp
            and is_ours(binding.state.process)
        )

    async def _connect_locked(self) -> KvClient | Unavailable | EngineRestart:
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
        # The lifetime is the user's too: one started by `engine start` still runs until
        # `engine stop` after a heal, instead of becoming this session's and stopping with it.
        runs_until_stop = lost is not None and lost.state.runs_until_stop
        # Taken before the start: a session exiting meanwhile sees this lease and leaves the
        # engine running (release and start are serialized on the engine's lock).
        await self._lease.take()
        self._restart = EngineRestart.begin(
            lambda: self.engine.start(
                backend=backend or self.settings.engine_backend,
                port=self.settings.engine_port,
                progress=lambda message: log.info("%s", message),
                runs_until_stop=runs_until_stop,
                resp=resp,
            ),
            lost,
        )
        return self._restart

    async def _finish(self, restart: EngineRestart) -> None:
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
        self._binding = Binding(state, stamp)

    async def _point_at(self, base_url: str) -> KvClient:
        # A restarted engine may have a new token (after an unclean stop) on the same port.
        token = self.engine.existing_token()
        if self._client is None or self._client.base_url != base_url or self._client_token != token:
            await self._drop_client()
            self._client = self._new_client(base_url, token)
            self._client_token = token
        return self._client

    def _new_client(self, base_url: str, token: SecretStr | None) -> KvClient:
        target = KvTarget(
            base_url,
            token,
            "managed",
            # The state records the backend, so key limits need no stats call to learn it.
            self._binding.state.backend if self._binding is not None else None,
            self.engine.token_path,
            data_dir=self.settings.data_dir,
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
        data_dir = self.engine.data_dir
        if (refusal := await anyio.to_thread.run_sync(dependents_refusal, data_dir)) is not None:
            return refusal
        return stop_refusal(
            state,
            await self._lease.others(),
            what=f"the engine in {self.engine.data_dir}",
            stop_command="graph-kvcache-mcp engine stop",
            afterwards=" (a session still using it starts it again on its next KV call)",
        )


def _stamp(path: Path) -> StateStamp | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)
