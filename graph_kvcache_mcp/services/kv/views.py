"""Output models for KV operations, shared by the MCP tools and the CLI (`--json` prints them)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.blobs import encode_b64, sha256_hex
from graph_kvcache_mcp.domain.engine.kv_stats import (
    ClientCounters,
    EngineStats,
    KvStatsReport,
    stats_note,
)
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.outcomes import (
    Hit,
    Miss,
    Outcome,
    PresenceOutcome,
    PutOutcome,
    Stored,
    Unavailable,
)

DEFAULT_INLINE_CAP_BYTES = 64 * 1024
KEPT_FIRST_NOTE = (
    "the key already existed: the engine keeps the first value ever stored under a key, so these "
    "bytes were NOT stored (only its reference count moved)"
)


class KvGetOut(BaseModel):
    """One key's lookup. A miss is normal; reachable=false means the store could not answer."""

    model_config = ConfigDict(frozen=True)

    key: str
    reachable: bool
    hit: bool = False
    size_bytes: int | None = Field(None, description="Bytes stored under the key, when found.")
    sha256: str | None = Field(None, description="SHA-256 of the value, when found.")
    value_b64: str | None = Field(None, description="The value, only when asked and small.")
    saved_to: str | None = Field(None, description="File the value was written to.")
    note: str | None = Field(None, description="Why the value is not inline, when it is not.")
    reason: str | None = Field(None, description="Why the store could not answer.")

    @classmethod
    def from_outcome(
        cls,
        key: str,
        outcome: Outcome[bytes],
        *,
        include_value: bool = False,
        inline_cap_bytes: int = DEFAULT_INLINE_CAP_BYTES,
        saved_to: str | None = None,
        oversize_hint: str = "ask again with a file path to save it to",
    ) -> Self:
        match outcome:
            case Hit(value):
                inline = include_value and len(value) <= inline_cap_bytes and saved_to is None
                note = None
                if include_value and not inline and saved_to is None:
                    note = (
                        f"value is {len(value):,} bytes, over the {inline_cap_bytes:,}-byte inline "
                        f"cap: {oversize_hint}"
                    )
                return cls(
                    key=key,
                    reachable=True,
                    hit=True,
                    size_bytes=len(value),
                    sha256=sha256_hex(value),
                    value_b64=encode_b64(value) if inline else None,
                    saved_to=saved_to,
                    note=note,
                )
            case Miss():
                return cls(key=key, reachable=True)
            case Unavailable(reason=reason):
                return cls(key=key, reachable=False, reason=reason)


class KvGetManyOut(BaseModel):
    """Lookups of several keys, in the order asked. reachable=false when no key could be read."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    results: list[KvGetOut]
    hits: int
    misses: int
    inline_bytes: int = Field(description="Bytes returned inline as base64 in this response.")
    reason: str | None = Field(None, description="Why the store could not answer (first failure).")

    @classmethod
    def from_results(cls, results: list[KvGetOut]) -> Self:
        failures = [r.reason for r in results if not r.reachable]
        return cls(
            reachable=len(failures) < len(results) or not results,
            results=results,
            hits=sum(r.hit for r in results),
            misses=sum(r.reachable and not r.hit for r in results),
            inline_bytes=sum(r.size_bytes or 0 for r in results if r.value_b64 is not None),
            reason=failures[0] if failures else None,
        )


class KvPutOut(BaseModel):
    """A PUT's result: whether the bytes were stored, and their size and digest."""

    model_config = ConfigDict(frozen=True)

    key: str
    reachable: bool
    state: Literal["stored_new", "already_present"] | None = None
    stored_new: bool | None = Field(
        None, description="True: these bytes are now stored. False: the key already had a value."
    )
    size_bytes: int
    sha256: str
    note: str | None = None
    reason: str | None = None

    @classmethod
    def from_outcome(cls, key: str, value: bytes, outcome: PutOutcome) -> Self:
        base = {"key": key, "size_bytes": len(value), "sha256": sha256_hex(value)}
        match outcome:
            case Stored(state):
                return cls(
                    reachable=True,
                    state=state,
                    stored_new=state == "stored_new",
                    note=None if state == "stored_new" else KEPT_FIRST_NOTE,
                    **base,
                )
            case Unavailable(reason=reason):
                return cls(reachable=False, reason=reason, **base)


class KeyPresence(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    present: bool | None = Field(description="None when the store could not answer for this key.")
    reason: str | None = None


class KvExistsOut(BaseModel):
    """Presence of many keys. reachable=false when no key could be checked."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    results: list[KeyPresence]
    present_count: int
    missing_count: int
    reason: str | None = None

    @classmethod
    def from_outcomes(cls, keys: list[str], outcomes: list[PresenceOutcome]) -> Self:
        results = [
            KeyPresence(key=key, present=None, reason=outcome.reason)
            if isinstance(outcome, Unavailable)
            else KeyPresence(key=key, present=outcome.present)
            for key, outcome in zip(keys, outcomes, strict=True)
        ]
        failures = [r.reason for r in results if r.present is None]
        return cls(
            reachable=len(failures) < len(results) or not results,
            results=results,
            present_count=sum(r.present is True for r in results),
            missing_count=sum(r.present is False for r in results),
            reason=failures[0] if failures else None,
        )


class KvStatsOut(BaseModel):
    """Normalized engine stats, this process's client counters and derived ratios."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    base_url: str
    backend: str | None = None
    engine: EngineStats | None = None
    client: ClientCounters | None = None
    hit_rate: float | None = None
    hit_rate_source: Literal["engine", "client"] | None = None
    dedup_ratio: float | None = None
    dedup_hit_share: float | None = None
    delta: EngineStats | None = Field(
        None,
        description="Engine counter movement since the snapshot passed as `since` (None when no "
        "snapshot was given or the backend does not report a counter).",
    )
    snapshot_id: str | None = Field(
        None,
        description="Names this result's `engine` counters: pass it as `since` to a later "
        "kv_stats call to get `delta`.",
    )
    lmcache: LmcacheCounters | None = Field(
        None,
        description="The managed lmcache server whose L2 is this engine (mp_native stack): "
        "its lookups, L1 and L2 hit tokens, L2 chunks stored and loaded (totals).",
    )
    note: str | None = Field(
        None, description="Why a field is null, and what an engine restart resets."
    )
    reason: str | None = None

    @classmethod
    def from_outcome(cls, base_url: str, outcome: KvStatsReport | Unavailable) -> Self:
        if isinstance(outcome, Unavailable):
            return cls(reachable=False, base_url=base_url, reason=outcome.reason)
        return cls(
            reachable=True,
            base_url=base_url,
            backend=outcome.engine.backend,
            note=stats_note(outcome.engine),
            **outcome.model_dump(),
        )
