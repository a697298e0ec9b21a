"""The server's way to the KV store: one protocol, two policies, chosen once at start-up.

`KvAccess` is what tools and services use: the shared client for a call (or `Unavailable`),
which engine that is, the managed engine's status, start and stop, and close. `state.py` picks
the policy from the settings, once:

- `ConfiguredKvAccess`: `EPISTEMIC_GRAPH_KVCACHE_URL` (or `_ADDR`) is set. One client for that
  engine; nothing is ever started, stopped or restarted, and start/stop requests are refused
  with the reason.
- `ManagedKvAccess` (`managed_access.py`): nothing configured, the embedded default. Leases,
  self-healing, background restarts and start/stop of the data dir's managed engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio.to_thread
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.engine.opener import KvTarget, sync_client_for
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.state import Backend, EngineStatus, EngineStopResult
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError

log = logging.getLogger(__name__)

Source = Literal["configured", "managed"]


@dataclass(frozen=True)
class AccessInfo:
    """Which engine the KV tools use, and what this server will do with it on exit."""

    source: Source
    base_url: str | None
    started_pid: int | None
    holds_lease: bool
    stops_on_exit: bool
    restarts: int


class KvAccess(Protocol):
    """One shared `KvClient` per server, plus this session's part in the engine's lifecycle."""

    settings: Settings
    engine: ManagedEngine
    """The managed engine of the data dir (its status is reported whichever policy is used)."""

    @property
    def source(self) -> Source: ...

    @property
    def label(self) -> str:
        """Where KV calls go, for results that need a `base_url` before any client exists."""
        ...

    def info(self) -> AccessInfo: ...

    def token(self) -> SecretStr | None:
        """The token the engine the KV tools use expects, for a client built elsewhere."""
        ...

    async def connect(self, *, wait_s: float | None = None) -> KvClient | Unavailable:
        """The shared client, or why there is none; waits at most `wait_s` (default: the KV
        timeout)."""
        ...

    async def startup(self) -> None:
        """`--start-engine`: bring the engine up now instead of on first use."""
        ...

    async def start_engine(
        self, *, backend: Backend | None = None, port: int | None = None, resp: bool = False
    ) -> EngineStatus:
        """Start (or reuse) the managed engine and point the shared client at it.

        Raises:
            EngineProcessError: a URL is configured, or the engine could not start.
        """
        ...

    async def stop_engine(self, *, force: bool = False) -> EngineStopResult:
        """Stop the managed engine now, when no one else relies on it (or when forced).

        Raises:
            EngineProcessError: a URL is configured, or others rely on the engine and not forced.
        """
        ...

    async def aclose(self) -> None: ...

    async def client(self) -> KvClient:
        """The shared client, for callers that cannot report `Unavailable` themselves.

        Raises:
            EngineProcessError: the embedded engine could not be started; says why.
        """
        outcome = await self.connect()
        if isinstance(outcome, Unavailable):
            raise EngineProcessError(outcome.reason)
        return outcome

    async def engine_status(self) -> EngineStatus:
        """The managed engine's status; stale records and leases are removed unless read-only."""
        tidy = not self.settings.read_only
        return await anyio.to_thread.run_sync(lambda: self.engine.status(tidy=tidy))


class ConfiguredKvAccess(KvAccess):
    """The engine at `EPISTEMIC_GRAPH_KVCACHE_URL`: one client, no lifecycle at all."""

    def __init__(self, settings: Settings) -> None:
        if settings.kv_url is None:
            raise ValueError("ConfiguredKvAccess needs settings.kv_url")
        self.settings = settings
        self.url = settings.kv_url
        self.engine = ManagedEngine(settings.data_dir)
        self._client: KvClient | None = None

    def __repr__(self) -> str:
        return f"ConfiguredKvAccess(base_url={self.url!r})"

    @property
    def source(self) -> Source:
        return "configured"

    @property
    def label(self) -> str:
        return self._client.base_url if self._client is not None else self.url

    def info(self) -> AccessInfo:
        return AccessInfo(
            source="configured",
            base_url=self.label,
            started_pid=None,
            holds_lease=False,
            stops_on_exit=False,
            restarts=0,
        )

    def token(self) -> SecretStr | None:
        return self.settings.kv_token

    async def connect(self, *, wait_s: float | None = None) -> KvClient | Unavailable:
        if self._client is None:  # no await before the assignment: no second client
            target = KvTarget(self.url, self.settings.kv_token, "configured")
            self._client = KvClient(sync_client_for(target, self.settings))
        return self._client

    async def startup(self) -> None:
        if self.settings.start_engine:
            log.warning("--start-engine ignored: EPISTEMIC_GRAPH_KVCACHE_URL is set")

    async def start_engine(
        self, *, backend: Backend | None = None, port: int | None = None, resp: bool = False
    ) -> EngineStatus:
        raise EngineProcessError(self._refusal("start"))

    async def stop_engine(self, *, force: bool = False) -> EngineStopResult:
        raise EngineProcessError(self._refusal("stop"))

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _refusal(self, verb: str) -> str:
        return (
            f"this server uses the engine at {self.url} "
            "(EPISTEMIC_GRAPH_KVCACHE_URL/ADDR is set) and never starts or stops engines; "
            f"to {verb} the local managed engine, run the server without that variable"
        )
