"""The server's way to the KV store: resolves the engine once, on first use, and shares one client.

With nothing configured this is where the embedded default lives (start a managed engine on first
use, stop it on exit unless asked to keep it); with a URL configured it never starts anything.
"""

from __future__ import annotations

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.kv_http import KvClient
from graph_kvcache_mcp.connectors.kv_open import KvTarget, resolve_kv_target, sync_client_for


class KvAccess:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: KvClient | None = None
        self._target: KvTarget | None = None
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"KvAccess(target={self._target!r})"

    async def client(self) -> KvClient:
        """The shared client, resolving (and, when embedded, starting) the engine on first use."""
        async with self._lock:
            if self._client is None:
                self._target = resolve_kv_target(self.settings)
                self._client = KvClient(sync_client_for(self._target, self.settings))
            return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
