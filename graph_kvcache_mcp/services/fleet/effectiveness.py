"""fleet_effectiveness / `fleet effectiveness`: what each instance's prefix cache and KV tiers
paid over a window, from the counters taken at its start (`FleetCounters`, carried by a `since`
id) and now; counted across the managed restarts of the data dir's vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread

from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection, InstanceProbe
from graph_kvcache_mcp.connectors.vllm.metrics import final_snapshots
from graph_kvcache_mcp.domain.fleet.findings import SourceSplit, fleet_split, source_split
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters, counters_moved
from graph_kvcache_mcp.domain.vllm.chat import window_tiers
from graph_kvcache_mcp.domain.vllm.metrics import (
    MetricsSnapshot,
    baseline_across,
    restarted,
    window,
)
from graph_kvcache_mcp.services.fleet.tiers import TierSources, server_counters
from graph_kvcache_mcp.services.fleet.views import FleetEffectivenessOut, InstanceEffect


@dataclass(frozen=True)
class FleetCounters:
    """Every instance's counters at one moment (None: it did not answer), and the counters of
    the LMCache server each instance has to itself (`services.fleet.tiers.server_counters`)."""

    taken_at: float
    snapshots: dict[str, MetricsSnapshot | None] = field(default_factory=dict)
    lmcache: dict[str, LmcacheCounters] = field(default_factory=dict)

    def baseline(self) -> dict[str, Any]:
        """JSON data a `since` id carries; `from_baseline` reads it back."""
        return {
            "taken_at": self.taken_at,
            "snapshots": {n: s.baseline() if s else None for n, s in self.snapshots.items()},
            "lmcache": {n: c.model_dump() for n, c in self.lmcache.items()},
        }

    @classmethod
    def from_baseline(cls, data: Any) -> FleetCounters:
        """Raises: ValueError or ValidationError: not what `baseline` wrote."""
        if not isinstance(data, dict) or not isinstance(data.get("snapshots"), dict):
            raise ValueError("not a fleet baseline")
        snapshots = {
            str(name): None if snap is None else MetricsSnapshot.model_validate(snap)
            for name, snap in data["snapshots"].items()
        }
        lmcache = {
            str(name): LmcacheCounters.model_validate(counters)
            for name, counters in dict(data.get("lmcache") or {}).items()
        }
        return cls(float(data["taken_at"]), snapshots, lmcache)


async def counters(conn: FleetConnection, tiers: TierSources | None = None) -> FleetCounters:
    """Every instance's counters now (with `tiers`, its own LMCache server's too)."""
    probes = await conn.probe_all()
    return await _counters_of(conn, probes, tiers)


async def _counters_of(
    conn: FleetConnection, probes: Mapping[str, InstanceProbe], tiers: TierSources | None
) -> FleetCounters:
    taken_at = time.time()
    lmcache = await server_counters(conn, tiers) if tiers is not None else {}
    return FleetCounters(taken_at, {name: p.snapshot for name, p in probes.items()}, lmcache)


async def effectiveness(
    conn: FleetConnection,
    since: FleetCounters | None,
    *,
    since_id: str | None = None,
    data_dir: Path | None = None,
    tiers: TierSources | None = None,
) -> tuple[FleetEffectivenessOut, FleetCounters]:
    """What moved since `since` (None: since each instance started), per instance and summed,
    counted across the managed restarts of `data_dir`'s vLLM (their final counts recorded) and
    flagged `counter_reset` across any other restart; over a window, each instance's cached
    tokens by tier, the external part split into L1 and L2 when `tiers` finds it an LMCache
    server of its own; also the counters taken now, for the next window."""
    probes = await conn.probe_all()
    now = await _counters_of(conn, probes, tiers)
    effects = [
        await _instance_effect(name, probe, since, now, data_dir) for name, probe in probes.items()
    ]
    out = FleetEffectivenessOut(
        since=since_id,
        window_s=round(now.taken_at - since.taken_at, 3) if since else None,
        instances=effects,
        fleet=fleet_split([e.split for e in effects if e.split and not e.split.counter_reset]),
    )
    return out, now


async def _instance_effect(
    name: str,
    probe: InstanceProbe,
    since: FleetCounters | None,
    now: FleetCounters,
    data_dir: Path | None,
) -> InstanceEffect:
    """One instance's window: prompt tokens by source, tiers, the engine connector's blocks."""
    after = probe.snapshot
    if not probe.reachable or after is None:
        reason = probe.reason or "it exports no /metrics"
        return InstanceEffect(name=name, reachable=probe.reachable, reason=reason)
    before = since.snapshots.get(name) if since else None
    if before is None:
        return InstanceEffect(
            name=name,
            reachable=True,
            split=source_split(None, after.prompt_tokens_by_source),
            engine_kv_loaded_blocks=after.engine_kv_loaded_blocks,
            engine_kv_saved_blocks=after.engine_kv_saved_blocks,
        )
    finals = []
    if data_dir is not None and restarted(before, after):
        finals = await anyio.to_thread.run_sync(final_snapshots, data_dir, after.model_name)
    across = baseline_across(before, after, finals)
    split = (
        SourceSplit(counter_reset=True)
        if across is None
        else source_split(across[0].prompt_tokens_by_source, after.prompt_tokens_by_source)
    )
    moved = window(before, after, finals)
    server_then = since.lmcache.get(name) if since else None
    server_now = now.lmcache.get(name)
    server_moved = counters_moved(server_then, server_now) if server_then and server_now else None
    return InstanceEffect(
        name=name,
        reachable=True,
        split=split,
        tiers=window_tiers(moved, server_moved),
        engine_kv_loaded_blocks=moved.engine_kv_loaded_blocks,
        engine_kv_saved_blocks=moved.engine_kv_saved_blocks,
    )
