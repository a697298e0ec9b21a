"""The lifespan state every tool reaches through `tools._common.state_of(ctx)`."""

from __future__ import annotations

from dataclasses import dataclass, field

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.kv_access import KvAccess


@dataclass
class AppState:
    """Shared clients, created once per server (per stdio process, HTTP server or test Client)."""

    settings: Settings
    kv: KvAccess = field(init=False)

    def __post_init__(self) -> None:
        self.kv = KvAccess(self.settings)

    async def aclose(self) -> None:
        await self.kv.aclose()
