"""Fleet memory: each LMCache server's L1 and the shared L2 (the engine), from the coordinator's
`GET /instances/usage`. Pure: no I/O.

The coordinator counts bytes from the servers' store and evict events. A pool an adapter declares
`"shared": true` (our engine adapter does) is counted once for the fleet, in `shared_modules`;
an unshared L2 is counted per storing server, and its bytes only grow (the engine never reports
an eviction) and stay with a server after it stops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

GIB = 1024**3


class PoolUse(BaseModel):
    """One memory pool: a server's L1, or an L2 backend."""

    model_config = ConfigDict(frozen=True)

    tier: str
    backend: str
    used_bytes: int
    capacity_bytes: int | None = Field(None, description="None: no capacity declared.")
    usage_ratio: float | None = None


class ServerMemory(BaseModel):
    """One LMCache server's own pools."""

    model_config = ConfigDict(frozen=True)

    server: str = Field(description="Its HTTP URL.")
    instances: list[str] = Field(description="Fleet instances it serves.")
    l1: PoolUse | None = None
    l2: list[PoolUse] = Field(default_factory=list, description="Unshared L2, per server.")
    reason: str | None = Field(None, description="Why its pools are unknown.")


class FleetMemory(BaseModel):
    """fleet_status's memory: servers' L1 and the shared L2, counted once."""

    model_config = ConfigDict(frozen=True)

    servers: list[ServerMemory]
    shared_l2: list[PoolUse] = Field(default_factory=list, description="Counted once.")


def pool_of(module: Mapping[str, Any]) -> PoolUse:
    capacity = int(module.get("capacity_bytes") or 0)
    ratio = module.get("usage_ratio")
    return PoolUse(
        tier=str(module.get("tier") or "?"),
        backend=str(module.get("backend") or "?"),
        used_bytes=int(module.get("used_bytes") or 0),
        capacity_bytes=capacity or None,
        usage_ratio=float(ratio) if isinstance(ratio, int | float) else None,
    )


def server_memory(
    usage: Mapping[str, Any], instance_id: str, *, server: str, instances: Sequence[str]
) -> ServerMemory:
    """The pools `usage` (a `/instances/usage` body) gives `instance_id`."""
    for item in usage.get("instances") or []:
        if isinstance(item, dict) and item.get("instance_id") == instance_id:
            pools = [pool_of(m) for m in item.get("modules") or [] if isinstance(m, dict)]
            return ServerMemory(
                server=server,
                instances=list(instances),
                l1=next((p for p in pools if p.tier == "l1"), None),
                l2=[p for p in pools if p.tier == "l2"],
            )
    return ServerMemory(
        server=server,
        instances=list(instances),
        reason="the coordinator reports no memory for it yet (it reports after its first store)",
    )


def shared_pools(usage: Mapping[str, Any]) -> list[PoolUse]:
    return [pool_of(m) for m in usage.get("shared_modules") or [] if isinstance(m, dict)]


def l1_pressure(memory: FleetMemory | None) -> dict[str, PoolUse]:
    """Each fleet instance's server L1, for the pressure ranking."""
    if memory is None:
        return {}
    return {name: s.l1 for s in memory.servers if s.l1 is not None for name in s.instances}


def describe_pool(pool: PoolUse) -> str:
    used = f"{pool.used_bytes / GIB:.2f} GiB"
    if pool.capacity_bytes is None:
        return f"{used} (no capacity declared)"
    return f"{used} of {pool.capacity_bytes / GIB:.2f} GiB ({(pool.usage_ratio or 0) * 100:.1f}%)"
