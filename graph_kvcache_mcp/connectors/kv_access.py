"""The server's way to the KV store: resolves the engine once, on first use, and shares one client.

With `EPISTEMIC_GRAPH_KVCACHE_URL` (or `_ADDR`) set, that engine is used and nothing is ever
started or stopped. With nothing configured this is the embedded default: the managed engine of the
data dir is reused when one already runs, else started on first KV use (or at startup with
`--start-engine`); on exit only an engine *this* server started is stopped, unless `--keep-engine`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine_process import (
    Backend,
    EngineStatus,
    EngineStopResult,
    ManagedEngine,
)
from graph_kvcache_mcp.connectors.kv_http import KvClient
from graph_kvcache_mcp.connectors.kv_open import KvTarget, sync_client_for
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError

log = logging.getLogger(__name__)

Source = Literal["configured", "managed"]

STOPPED_BY_TOOL = (
    "the managed engine was stopped with engine_stop; call engine_start to start it again"
)


@dataclass(frozen=True)
class AccessInfo:
    """Which engine the KV tools use, and what this server will do with it on exit."""

    source: Source
    base_url: str | None
    started_pid: int | None
    stops_on_exit: bool


class KvAccess:
    """One shared `KvClient` per server, plus the embedded engine's lifecycle."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = ManagedEngine(settings.data_dir)
        self._client: KvClient | None = None
        self._started_pid: int | None = None
        self._stopped_by_tool = False
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
        return AccessInfo(
            source=self.source,
            base_url=self._client.base_url if self._client is not None else self.settings.kv_url,
            started_pid=self._started_pid,
            stops_on_exit=self._started_pid is not None and not self.settings.keep_engine,
        )

    async def connect(self) -> KvClient | Unavailable:
        """The shared client; with nothing configured, reuse or start the managed engine first."""
        async with self._lock:
            return await self._connect_locked()

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
        outcome = await self.connect()
        if isinstance(outcome, Unavailable):
            log.warning("managed engine did not start: %s", outcome.reason)

    async def start_engine(
        self, *, backend: Backend | None = None, port: int | None = None
    ) -> EngineStatus:
        """Start (or reuse) the managed engine and point the shared client at it.

        Raises:
            EngineProcessError: a URL is configured, or the engine could not start.
        """
        self._refuse_when_configured("start")
        async with self._lock:
            status = await self._start_locked(backend=backend, port=port)
            self._stopped_by_tool = False
            return status

    async def stop_engine(self, *, force: bool = False) -> EngineStopResult:
        """Stop the managed engine; one this server did not start only with `force`.

        Raises:
            EngineProcessError: a URL is configured, or the engine is someone else's and not forced.
        """
        self._refuse_when_configured("stop")
        async with self._lock:
            state = await anyio.to_thread.run_sync(self.engine.running_state)
            if state is None:
                return EngineStopResult(
                    stopped=False, how="not_running", data_dir=str(self.engine.data_dir)
                )
            if state.process.pid != self._started_pid and not force:
                raise EngineProcessError(
                    f"the engine in {self.engine.data_dir} (pid {state.process.pid}) was not "
                    "started by this server (the CLI or another session did) and may be in use "
                    "elsewhere; pass force=true to stop it anyway"
                )
            await self._drop_client()
            result = await anyio.to_thread.run_sync(self.engine.stop)
            self._started_pid = None
            self._stopped_by_tool = True
            return result

    async def engine_status(self) -> EngineStatus:
        return await anyio.to_thread.run_sync(self.engine.status)

    async def aclose(self) -> None:
        """Close the client; stop the engine only when this server started it (and may)."""
        # Runs at shutdown, often inside a cancelled scope: shield so the engine really stops.
        with anyio.CancelScope(shield=True):
            await self._drop_client()
            if self._started_pid is None or self.settings.keep_engine:
                return
            state = await anyio.to_thread.run_sync(self.engine.running_state)
            if state is not None and state.process.pid == self._started_pid:
                result = await anyio.to_thread.run_sync(self.engine.stop)
                log.info("stopped the managed engine (pid %s, %s)", result.pid, result.how)
            self._started_pid = None

    # --- internals ---------------------------------------------------------------------------

    async def _connect_locked(self) -> KvClient | Unavailable:
        if self._client is not None:
            return self._client
        if self.settings.kv_url is not None:
            self._client = self._new_client(self.settings.kv_url, configured=True)
            return self._client
        if self._stopped_by_tool:
            return Unavailable(STOPPED_BY_TOOL)
        try:
            await self._start_locked(backend=None, port=None)
        except EngineProcessError as exc:
            return Unavailable(f"managed engine could not start: {exc}")
        assert self._client is not None  # _start_locked always sets it on success
        return self._client

    async def _start_locked(self, *, backend: Backend | None, port: int | None) -> EngineStatus:
        status = await anyio.to_thread.run_sync(
            lambda: self.engine.start(
                backend=backend or self.settings.engine_backend,
                port=port or self.settings.engine_port,
                progress=lambda message: log.info("%s", message),
            )
        )
        if not status.reused:
            self._started_pid = status.pid
        if status.base_url is None:  # start() only returns once the engine answers
            raise EngineProcessError(f"engine started but reports no address: {status.reason}")
        if self._client is None or self._client.base_url != status.base_url:
            await self._drop_client()
            self._client = self._new_client(status.base_url, configured=False)
        return status

    def _new_client(self, base_url: str, *, configured: bool) -> KvClient:
        target = (
            KvTarget(base_url, self.settings.kv_token, "configured")
            if configured
            else KvTarget(base_url, self.engine.token(), "managed")
        )
        return KvClient(sync_client_for(target, self.settings))

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _refuse_when_configured(self, verb: str) -> None:
        if self.settings.kv_url is not None:
            raise EngineProcessError(
                f"this server uses the engine at {self.settings.kv_url} "
                "(EPISTEMIC_GRAPH_KVCACHE_URL/ADDR is set) and never starts or stops engines; "
                f"to {verb} the local managed engine, run the server without that variable"
            )
