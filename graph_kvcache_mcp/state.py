"""The lifespan state every tool reaches through `tools._common.state_of(ctx)`."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
from pydantic import ValidationError

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.access import ConfiguredKvAccess, KvAccess
from graph_kvcache_mcp.connectors.engine.managed_access import ManagedKvAccess
from graph_kvcache_mcp.connectors.files.snapshot_key import snapshot_key
from graph_kvcache_mcp.connectors.fleet.access import FleetAccess
from graph_kvcache_mcp.connectors.lmcache.access import LmcacheAccess
from graph_kvcache_mcp.connectors.vllm.access import VllmAccess
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.snapshot_ids import SnapshotIdError, seal, unseal
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.services.bundle.bundles import BundleCounters
from graph_kvcache_mcp.services.fleet.feed_edge import fleet_access
from graph_kvcache_mcp.services.fleet.operations import FleetCounters
from graph_kvcache_mcp.services.stack.runtime import (
    dependency_reason,
    lmcache_target,
    server_counters,
)

T = TypeVar("T")


class Snapshots(Generic[T]):
    """Hands out `since` ids that carry their snapshot, signed with the data dir's key
    (`domain/snapshot_ids.py`): the server keeps nothing, so an id holds across other sessions'
    calls and server restarts, and a forged or foreign one is refused."""

    def __init__(
        self,
        kind: str,
        key: Callable[[], bytes],
        dump: Callable[[T], Any],
        load: Callable[[Any], T],
    ) -> None:
        self.kind = kind
        self._key = key
        self._dump = dump
        self._load = load

    def keep(self, snapshot: T) -> str | None:
        """The id of `snapshot`; None when no id can be made (an unusable key or a snapshot
        too large), so the caller gets its result without one."""
        payload = json.dumps(self._dump(snapshot), separators=(",", ":")).encode()
        try:
            return seal(self.kind, payload, self._key())
        except (SnapshotIdError, ConfigError):
            return None

    def find(self, snapshot_id: str, tool: str) -> T:
        """The snapshot `snapshot_id` carries.

        Raises:
            SnapshotIdError: forged, altered, foreign, of another kind, or unreadable here.
            ConfigError: the signing key cannot be read.
        """
        payload = unseal(self.kind, snapshot_id, self._key(), tool=tool)
        try:
            return self._load(json.loads(payload))
        except (ValueError, ValidationError) as exc:
            raise SnapshotIdError(
                f"since holds a snapshot this version cannot read: call {tool} without since "
                "and pass the snapshot_id it returns"
            ) from exc


@dataclass(frozen=True)
class VllmBaseline:
    """What a vllm_metrics id carries: vLLM's counters and the lmcache server's (None: none)."""

    vllm: MetricsSnapshot
    lmcache: LmcacheCounters | None = None

    def dump(self) -> dict[str, Any]:
        lmcache = None if self.lmcache is None else self.lmcache.model_dump(exclude_none=True)
        return {"vllm": self.vllm.baseline(), "lmcache": lmcache}

    @classmethod
    def load(cls, data: Any) -> VllmBaseline:
        """Raises: ValueError or ValidationError: not what `dump` wrote."""
        if not isinstance(data, dict):
            raise ValueError("not a vllm baseline")
        lmcache = data.get("lmcache")
        return cls(
            MetricsSnapshot.model_validate(data.get("vllm")),
            None if lmcache is None else LmcacheCounters.model_validate(lmcache),
        )


@dataclass
class AppState:
    """Shared clients, created once per server (per stdio process, HTTP server or test Client)."""

    settings: Settings
    kv: KvAccess = field(init=False)
    vllm: VllmAccess = field(init=False)
    lmcache: LmcacheAccess = field(init=False)
    fleet: FleetAccess = field(init=False)
    bundles: BundleCounters = field(default_factory=BundleCounters)
    kv_snapshots: Snapshots[EngineStats] = field(init=False)
    vllm_snapshots: Snapshots[VllmBaseline] = field(init=False)
    fleet_snapshots: Snapshots[FleetCounters] = field(init=False)

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
        tier = lmcache_target(self.settings)  # the settings are this server's: resolved once
        self.vllm = VllmAccess(self.settings, tier_for=lambda root: server_counters(tier, root))
        self.lmcache = LmcacheAccess(
            self.settings, dependents=lambda server: dependency_reason(data_dir, server)
        )
        self.fleet = fleet_access(self.settings)
        key = functools.cache(lambda: snapshot_key(self.settings))
        self.kv_snapshots = Snapshots(
            "kv", key, lambda s: s.model_dump(mode="json"), EngineStats.model_validate
        )
        self.vllm_snapshots = Snapshots("vllm", key, VllmBaseline.dump, VllmBaseline.load)
        self.fleet_snapshots = Snapshots(
            "fleet", key, lambda c: c.baseline(), FleetCounters.from_baseline
        )
        self.closed = anyio.Event()

    async def startup(self) -> None:
        await self.kv.startup()

    async def aclose(self) -> None:
        await self.fleet.aclose()
        await self.vllm.aclose()
        await self.lmcache.aclose()  # before the engine: the server's L2 adapter writes to it
        await self.kv.aclose()
