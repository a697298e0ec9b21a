"""The lifespan state every tool reaches through `tools._common.state_of(ctx)`."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.access import ConfiguredKvAccess, KvAccess
from graph_kvcache_mcp.connectors.engine.managed_access import ManagedKvAccess
from graph_kvcache_mcp.connectors.fleet.access import FleetAccess
from graph_kvcache_mcp.connectors.lmcache.access import LmcacheAccess
from graph_kvcache_mcp.connectors.stack.mp_stack import ManagedServerCounters, dependency_reason
from graph_kvcache_mcp.connectors.vllm.access import VllmAccess
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.services.bundle.bundles import BundleCounters

if TYPE_CHECKING:
    from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot
    from graph_kvcache_mcp.services.fleet.operations import FleetCounters

T = TypeVar("T")
SNAPSHOTS_KEPT = 32


class Snapshots(Generic[T]):
    """The last few snapshots a tool handed out, under short ids a later call passes back as
    `since` (so a tool's input schema never has to embed its whole output model)."""

    def __init__(self, kind: str, *, limit: int = SNAPSHOTS_KEPT) -> None:
        self.kind = kind
        self.limit = limit
        self._kept: OrderedDict[str, T] = OrderedDict()

    def keep(self, snapshot: T) -> str:
        """Store `snapshot`, dropping the oldest beyond `limit`; return its id."""
        # Random, not a counter: an id from an earlier server process must not name a new
        # snapshot by accident.
        snapshot_id = f"{self.kind}-{secrets.token_hex(4)}"
        self._kept[snapshot_id] = snapshot
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)
        return snapshot_id

    def find(self, snapshot_id: str) -> T | None:
        return self._kept.get(snapshot_id)


@dataclass
class AppState:
    """Shared clients, created once per server (per stdio process, HTTP server or test Client)."""

    settings: Settings
    kv: KvAccess = field(init=False)
    vllm: VllmAccess = field(init=False)
    lmcache: LmcacheAccess = field(init=False)
    fleet: FleetAccess = field(init=False)
    bundles: BundleCounters = field(default_factory=BundleCounters)
    kv_snapshots: Snapshots[EngineStats] = field(default_factory=lambda: Snapshots("kv"))
    vllm_snapshots: Snapshots[MetricsSnapshot] = field(default_factory=lambda: Snapshots("vllm"))
    fleet_snapshots: Snapshots[FleetCounters] = field(default_factory=lambda: Snapshots("fleet"))

    closed: anyio.Event = field(init=False, repr=False)
    """Set once the lifespan has cleaned up (a signalled `serve` waits for it)."""

    def __post_init__(self) -> None:
        data_dir = self.settings.data_dir
        # The one place the KV policy is chosen: a configured engine, or the managed one.
        self.kv = (
            ConfiguredKvAccess(self.settings)
            if self.settings.kv_url is not None
            else ManagedKvAccess(self.settings)
        )
        self.vllm = VllmAccess(
            self.settings, tier_for=lambda root: ManagedServerCounters(data_dir, root)
        )
        self.lmcache = LmcacheAccess(
            self.settings, dependents=lambda server: dependency_reason(data_dir, server)
        )
        self.fleet = FleetAccess(self.settings)
        self.closed = anyio.Event()

    async def startup(self) -> None:
        await self.kv.startup()

    async def aclose(self) -> None:
        await self.fleet.aclose()
        await self.vllm.aclose()
        await self.lmcache.aclose()  # before the engine: the server's L2 adapter writes to it
        await self.kv.aclose()
