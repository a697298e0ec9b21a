"""`kv probe`: is the store reachable, does it accept our token, does a block round-trip, does a
repeat PUT move the dedup counter, and how fast are small operations.

Writes two small canary blocks under `probe:<random hex>` when `write=True` (the engine has no
DELETE, so they stay: 2 x 64 bytes per probe).
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.domain.latency import percentile
from graph_kvcache_mcp.domain.outcomes import Hit, Stored, Unavailable

CANARY_BYTES = 64


class ProbeCheck(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str = Field(description="reachable | auth | round_trip | dedup | latency")
    passed: bool
    detail: str


class KvProbeOut(BaseModel):
    """Each check with pass/fail and a reason; latency over `samples` small reads."""

    model_config = ConfigDict(frozen=True)

    base_url: str
    reachable: bool
    passed: bool = Field(description="True when every check that ran passed.")
    checks: list[ProbeCheck]
    backend: str | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    samples: int = 0
    reason: str | None = Field(None, description="Why the store could not be probed.")


ProbeSamples = Annotated[int, Field(ge=1, le=500)]
"""How many small reads a probe times for latency."""


async def probe_kv(client: KvClient, *, samples: int = 20, write: bool = True) -> KvProbeOut:
    """Run the checks in order; stop early when the store is unreachable or refuses the token."""
    checks: list[ProbeCheck] = []
    before = await client.engine_stats()
    if isinstance(before, Unavailable):
        refused = before.status == 401
        checks.append(
            ProbeCheck(
                name="reachable",
                passed=refused,
                detail="engine answered" if refused else before.reason,
            )
        )
        if refused:
            checks.append(ProbeCheck(name="auth", passed=False, detail=before.reason))
        return KvProbeOut(
            base_url=client.base_url,
            reachable=refused,
            passed=False,
            checks=checks,
            reason=before.reason,
        )
    checks.append(ProbeCheck(name="reachable", passed=True, detail="GET /kv/stats answered 200"))
    checks.append(ProbeCheck(name="auth", passed=True, detail="bearer token accepted"))

    key = f"probe:{secrets.token_hex(16)}"
    if write:
        checks.extend(await _round_trip_and_dedup(client, key, before.dedup_hits))
    timings: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        outcome = await client.contains(key)
        timings.append((time.perf_counter() - started) * 1000)
        if isinstance(outcome, Unavailable):
            checks.append(ProbeCheck(name="latency", passed=False, detail=outcome.reason))
            break
    else:
        p50, p95 = percentile(timings, 50), percentile(timings, 95)
        checks.append(
            ProbeCheck(
                name="latency",
                passed=True,
                detail=f"{samples} HEAD requests: p50 {p50:.2f} ms, p95 {p95:.2f} ms",
            )
        )
    p50, p95 = percentile(timings, 50), percentile(timings, 95)
    return KvProbeOut(
        base_url=client.base_url,
        reachable=True,
        passed=all(check.passed for check in checks),
        checks=checks,
        backend=before.backend,
        latency_p50_ms=None if p50 is None else round(p50, 3),
        latency_p95_ms=None if p95 is None else round(p95, 3),
        samples=len(timings),
    )


async def _round_trip_and_dedup(
    client: KvClient, key: str, dedup_before: int | None
) -> list[ProbeCheck]:
    canary = secrets.token_bytes(CANARY_BYTES)
    stored = await client.put(key, canary)
    if not isinstance(stored, Stored):
        return [ProbeCheck(name="round_trip", passed=False, detail=f"PUT failed: {stored.reason}")]
    back = await client.get(key)
    if isinstance(back, Hit) and back.value == canary:
        round_trip = ProbeCheck(
            name="round_trip",
            passed=True,
            detail=f"PUT {key} ({CANARY_BYTES} random bytes, {stored.state}) and GET returned "
            "the same bytes",
        )
    else:
        what = back.reason if isinstance(back, Unavailable) else "a miss or different bytes"
        round_trip = ProbeCheck(name="round_trip", passed=False, detail=f"GET gave {what}")
    repeat = await client.put(key, canary)
    after = await client.engine_stats()
    if isinstance(repeat, Unavailable) or isinstance(after, Unavailable):
        reason = repeat.reason if isinstance(repeat, Unavailable) else getattr(after, "reason", "")
        return [round_trip, ProbeCheck(name="dedup", passed=False, detail=reason)]
    moved = (
        None
        if after.dedup_hits is None or dedup_before is None
        else after.dedup_hits - dedup_before
    )
    dedup = ProbeCheck(
        name="dedup",
        passed=repeat.state == "already_present" and bool(moved and moved >= 1),
        detail=f"repeat PUT answered {repeat.state}; dedup_hits moved by {moved}",
    )
    return [round_trip, dedup]
