"""What an `lmcache server`'s `GET /status` says, reduced to what an operator reads. Pure: no I/O.

LMCache 0.5.6 answers with a nested dict (storage manager, L1 managers, controllers, L2 adapters);
the fields below are the ones that tell whether the server is usable and how full it is. A field
the server did not send stays None (never 0).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class L2AdapterHealth(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    healthy: bool | None
    detail: dict[str, Any] = Field(default_factory=dict, description="The adapter's own report.")


class LmcacheServerReport(BaseModel):
    """The server's health, L1 usage and each L2 adapter's health."""

    model_config = ConfigDict(frozen=True)

    healthy: bool | None = None
    chunk_size: int | None = None
    hash_algorithm: str | None = None
    active_sessions: int | None = None
    l1_used_bytes: int | None = None
    l1_total_bytes: int | None = None
    l1_objects: int | None = None
    l2_adapters: list[L2AdapterHealth] = Field(default_factory=list)


def report_from_status(status: dict[str, Any]) -> LmcacheServerReport:
    """Read LMCache's `/status` JSON; unknown shapes leave fields None."""
    storage = _dict(status.get("storage_manager"))
    l1 = _dict(storage.get("l1_manager"))
    adapters = storage.get("l2_adapters")
    return LmcacheServerReport(
        healthy=_bool(status.get("is_healthy")),
        chunk_size=_int(status.get("chunk_size")),
        hash_algorithm=status.get("hash_algorithm")
        if isinstance(status.get("hash_algorithm"), str)
        else None,
        active_sessions=_int(status.get("active_sessions")),
        l1_used_bytes=_int(l1.get("memory_used_bytes")),
        l1_total_bytes=_int(l1.get("memory_total_bytes")),
        l1_objects=_int(l1.get("total_object_count")),
        l2_adapters=[
            L2AdapterHealth(index=i, healthy=_bool(_dict(a).get("is_healthy")), detail=_dict(a))
            for i, a in enumerate(adapters if isinstance(adapters, list) else [])
        ],
    )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None
