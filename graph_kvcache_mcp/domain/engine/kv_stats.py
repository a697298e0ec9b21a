"""One stats model for both engine backends, plus client-side counters and derived ratios.

Pure: no I/O. The memory backend reports occupancy and dedup fields but never counts gets (its
`get_hits`/`get_misses` stay 0 forever); the durable backend reports hit counters only. A field the
backend does not report is None — never 0 — and the hit rate falls back to the client's own count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ClientCounters(BaseModel):
    """What this client itself did since it was created (the engine cannot tell us all of it)."""

    model_config = ConfigDict(frozen=True)

    gets: int = 0
    get_hits: int = 0
    get_misses: int = 0
    puts: int = 0
    puts_stored_new: int = 0
    puts_already_present: int = 0
    contains_checks: int = 0
    errors: int = 0
    retries: int = Field(0, description="Idempotent requests sent again after a transport fault.")
    bytes_read: int = 0
    bytes_written: int = 0

    def minus(self, earlier: ClientCounters) -> ClientCounters:
        mine, theirs = self.model_dump(), earlier.model_dump()
        return ClientCounters(**{name: mine[name] - theirs[name] for name in mine})


class EngineStats(BaseModel):
    """The engine's `/kv/stats`, normalized. None = this backend does not report the field."""

    model_config = ConfigDict(frozen=True)

    backend: Literal["memory", "durable", "unknown"]
    instance: str | None = Field(None, description="Durable backend instance id.")
    unique_blocks: int | None = None
    total_refs: int | None = None
    resident_bytes: int | None = None
    logical_bytes: int | None = None
    dedup_hits: int | None = None
    dedup_savings_bytes: int | None = None
    put_new: int | None = None
    get_hits: int | None = Field(None, description="None on the memory backend (never counted).")
    get_misses: int | None = None
    stale_retired: int | None = None
    stale_missed: int | None = None


_MEMORY_FIELDS = (
    "unique_blocks",
    "total_refs",
    "resident_bytes",
    "logical_bytes",
    "dedup_hits",
    "dedup_savings_bytes",
    "stale_retired",
)
_DURABLE_FIELDS = ("dedup_hits", "put_new", "get_hits", "get_misses", "stale_missed")


def normalize_engine_stats(raw: Mapping[str, Any]) -> EngineStats:
    """Map either backend's `/kv/stats` JSON onto `EngineStats`.

    Raises:
        ValueError: the body is not a stats object (a counter is not an integer).
    """
    backend = raw.get("backend")
    fields: tuple[str, ...]
    if backend == "memory":
        fields = _MEMORY_FIELDS
    elif backend == "durable":
        fields = _DURABLE_FIELDS
    else:
        fields = tuple(name for name in _MEMORY_FIELDS + _DURABLE_FIELDS if name in raw)
        backend = "unknown"
    values: dict[str, Any] = {}
    for name in fields:
        if name in raw:
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"stats field {name!r} is not an integer: {value!r}")
            values[name] = value
    instance = raw.get("instance")
    return EngineStats(
        backend=backend, instance=instance if isinstance(instance, str) else None, **values
    )


class KvStatsReport(BaseModel):
    """Engine stats + this client's counters + ratios derived from whichever side can tell."""

    model_config = ConfigDict(frozen=True)

    engine: EngineStats
    client: ClientCounters
    hit_rate: float | None = Field(
        None, ge=0, le=1, description="GET hits / GETs; None when no GET was counted."
    )
    hit_rate_source: Literal["engine", "client"] | None = None
    dedup_ratio: float | None = Field(
        None, description="logical_bytes / resident_bytes (memory backend); >1 means dedup saved."
    )
    dedup_hit_share: float | None = Field(
        None, ge=0, le=1, description="Repeat PUTs / all PUTs the engine saw."
    )


def build_report(engine: EngineStats, client: ClientCounters) -> KvStatsReport:
    """Derive ratios: the engine's hit counters when it keeps them, else the client's."""
    hit_rate: float | None = None
    source: Literal["engine", "client"] | None = None
    if engine.get_hits is not None and engine.get_misses is not None:
        total = engine.get_hits + engine.get_misses
        if total:
            hit_rate, source = engine.get_hits / total, "engine"
    elif client.gets:
        hit_rate, source = client.get_hits / client.gets, "client"
    dedup_ratio = None
    if engine.logical_bytes is not None and engine.resident_bytes:
        dedup_ratio = engine.logical_bytes / engine.resident_bytes
    dedup_share = None
    new_puts = engine.put_new if engine.put_new is not None else engine.unique_blocks
    if engine.dedup_hits is not None and new_puts is not None and engine.dedup_hits + new_puts:
        dedup_share = engine.dedup_hits / (engine.dedup_hits + new_puts)
    return KvStatsReport(
        engine=engine,
        client=client,
        hit_rate=hit_rate,
        hit_rate_source=source,
        dedup_ratio=dedup_ratio,
        dedup_hit_share=dedup_share,
    )


_RESETS = {
    "durable": "its counters count from the engine's last start",
    "memory": "its store and counters start empty at each engine start",
}


def stats_note(engine: EngineStats, since: EngineStats | None = None) -> str | None:
    """Why fields are null (the backend does not report them), what a restart resets, and
    whether the engine restarted since the `since` snapshot; None when there is nothing to say."""
    unreported = [
        name for name, value in engine if value is None and name not in ("backend", "instance")
    ]
    parts = []
    if unreported:
        parts.append(
            f"null = not reported by the {engine.backend} backend: {', '.join(unreported)}"
        )
    if reset := _RESETS.get(engine.backend):
        parts.append(reset)
    if since is not None and restarted(since, engine):
        parts.append(
            "the engine restarted after the `since` snapshot (counters went down): delta counts "
            "from that start"
        )
    return "; ".join(parts) or None


def restarted(before: EngineStats, after: EngineStats) -> bool:
    """Whether a counter went down between two snapshots, which only a restart does."""
    old = before.model_dump()
    return any(
        isinstance(value, int) and isinstance(old.get(name), int) and value < old[name]
        for name, value in after.model_dump().items()
    )


def stats_delta(before: EngineStats, after: EngineStats) -> EngineStats:
    """Counter movement between two snapshots of the same engine (None stays None).

    A counter that went down means the engine restarted; the delta then is the `after` value.
    """
    old, new = before.model_dump(), after.model_dump()
    moved: dict[str, Any] = {"backend": after.backend, "instance": after.instance}
    for name, value in new.items():
        if name in moved:
            continue
        prior = old.get(name)
        if value is None or prior is None:
            moved[name] = value
        else:
            moved[name] = value - prior if value >= prior else value
    return EngineStats(**moved)
