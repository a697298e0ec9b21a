"""The lifespan state every tool reaches through `tools._common.state_of(ctx)`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.kv_access import KvAccess
from graph_kvcache_mcp.connectors.vllm_access import VllmAccess
from graph_kvcache_mcp.services.bundles import BundleCounters


@dataclass
class AppState:
    """Shared clients, created once per server (per stdio process, HTTP server or test Client)."""

    settings: Settings
    kv: KvAccess = field(init=False)
    vllm: VllmAccess = field(init=False)
    bundles: BundleCounters = field(default_factory=BundleCounters)

    closed: anyio.Event = field(init=False, repr=False)
    """Set once the lifespan has cleaned up (a signalled `serve` waits for it)."""

    def __post_init__(self) -> None:
        self.kv = KvAccess(self.settings)
        self.vllm = VllmAccess(self.settings)
        self.closed = anyio.Event()

    async def startup(self) -> None:
        await self.kv.startup()

    async def aclose(self) -> None:
        await self.vllm.aclose()
        await self.kv.aclose()


# Static resources get no Context in SDK 2.3, so they find the live state through their server.
# A stack per server: each in-memory Client runs its own lifespan on the same server object.
_LIVE: WeakKeyDictionary[Any, list[AppState]] = WeakKeyDictionary()


def bind_live_state(server: object, state: AppState) -> None:
    _LIVE.setdefault(server, []).append(state)


def unbind_live_state(server: object, state: AppState) -> None:
    stack = _LIVE.get(server, [])
    stack[:] = [live for live in stack if live is not state]


def live_state(server: object) -> AppState | None:
    """The state of the server's most recent running lifespan, None when it is not running."""
    stack = _LIVE.get(server)
    return stack[-1] if stack else None
