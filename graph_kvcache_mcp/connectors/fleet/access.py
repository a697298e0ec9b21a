"""The fleet one server watches: its connection, made on first use and remade when the fleet
changes (the fleet file was edited, or a managed vLLM with KV events started or stopped).

`prepare` runs on every fleet before a connection to it is handed out: the service above hands
in what makes this host's edge carry the fleet's `tls://` feeds (`services.fleet.feed_edge`),
which a connector cannot reach itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet

if TYPE_CHECKING:  # zmq and openai load with the first fleet call, not with the server
    from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection

Prepare = Callable[[Fleet], Awaitable[None]]


class FleetAccess:
    """Hands out the current `FleetConnection`; close with `aclose()`."""

    def __init__(self, settings: Settings, *, prepare: Prepare | None = None) -> None:
        self.settings = settings
        self._prepare = prepare
        self._connection: FleetConnection | None = None
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"FleetAccess(file={self.settings.fleet_file})"

    async def connection(self, fleet_file: Path | None = None) -> FleetConnection:
        """The connection to the fleet as it is now described.

        Raises:
            ConfigError: no fleet, or a fleet file that is refused.
        """
        from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection, load_fleet

        async with self._lock:
            fleet = load_fleet(self.settings, fleet_file)
            if self._prepare is not None:
                await self._prepare(fleet)
            if self._connection is not None and self._connection.fleet == fleet:
                return self._connection
            if self._connection is not None:
                await self._connection.aclose()
                self._connection = None
            self._connection = FleetConnection(fleet, timeout_s=self.settings.vllm_timeout_s)
            return self._connection

    @classmethod
    @asynccontextmanager
    async def once(
        cls, settings: Settings, fleet_file: Path | None = None, *, prepare: Prepare | None = None
    ) -> AsyncIterator[FleetConnection]:
        """A connection for one CLI command, closed when the block ends.

        Raises:
            ConfigError: no fleet, or a fleet file that is refused.
        """
        access = cls(settings, prepare=prepare)
        try:
            yield await access.connection(fleet_file)
        finally:
            await access.aclose()

    async def aclose(self) -> None:
        async with self._lock:
            if self._connection is not None:
                await self._connection.aclose()
                self._connection = None
