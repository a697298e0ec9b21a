"""KV store tools (kv_*): stats, probe, get, save, put, exists. Thin adapters over services/ and
the shared `KvAccess`; registering the toolset also adds the kv guides (graph_kvcache is the
`compat` toolset).

Bad input (keys, base64, sizes, paths) is refused with `ToolError` before any I/O, so nothing is
stored and no engine is started for a call that cannot succeed.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from graph_kvcache_mcp.connectors.engine.access import KvAccess
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.files.access import create_exclusive
from graph_kvcache_mcp.domain.engine.keys import check_key
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats, stats_delta, stats_note
from graph_kvcache_mcp.domain.outcomes import Hit, Unavailable
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.kv.probe import KvProbeOut, ProbeCheck, ProbeSamples, probe_kv
from graph_kvcache_mcp.services.kv.stats import kv_stats as kv_stats_service
from graph_kvcache_mcp.services.kv.views import (
    DEFAULT_INLINE_CAP_BYTES,
    KvExistsOut,
    KvGetManyOut,
    KvGetOut,
    KvPutOut,
    KvStatsOut,
)
from graph_kvcache_mcp.tools import kv_guide
from graph_kvcache_mcp.tools._common import (
    READ_ONLY,
    WRITES_IDEMPOTENT,
    ToolSpec,
    register_all,
    snapshot_since,
    state_of,
)
from graph_kvcache_mcp.tools.file_paths import new_file_inside_roots
from graph_kvcache_mcp.tools.kv_input import (
    Key,
    Keys,
    check_keys,
    refused_input,
    value_from,
)

TOOLSET = "kv"

MAX_INLINE_CAP_BYTES = 1024 * 1024
# Each probe writes two fresh canary keys: harmless, but not read-only and not idempotent.
WRITES_CANARIES = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
# kv_save creates a file the caller names; it never overwrites one.
CREATES_FILE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)

Samples = Annotated[ProbeSamples, Field(description="Small requests to time for latency.")]


async def stats_out(access: KvAccess, since: EngineStats | None = None) -> KvStatsOut:
    """kv_stats' result (also served as the kv://stats resource)."""
    kv = await access.connect()
    if isinstance(kv, Unavailable):
        return KvStatsOut(reachable=False, base_url=access.label, reason=kv.reason)
    out = await kv_stats_service(kv, access.settings)
    if since is None or out.engine is None:
        return out
    if since.backend != out.engine.backend:
        raise ToolError(
            f"`since` is a snapshot of a {since.backend} backend but this store is "
            f"{out.engine.backend}: call kv_stats without since and use its snapshot_id"
        )
    note = stats_note(out.engine, since)
    return out.model_copy(update={"delta": stats_delta(since, out.engine), "note": note})


# --- tools ---------------------------------------------------------------------------------


async def kv_stats(
    ctx: Context[Any],
    since: Annotated[
        str | None,
        Field(description="snapshot_id of an earlier result: adds `delta`."),
    ] = None,
) -> KvStatsOut:
    """KV store counters (backend, blocks, bytes, dedup, hit rate) and this server's client
    counters; null = not reported. Pass its snapshot_id as since later to see what moved."""
    state = state_of(ctx)
    before = None if since is None else snapshot_since(state.kv_snapshots, since, "kv_stats")
    out = await stats_out(state.kv, before)
    if out.engine is None:
        return out
    return out.model_copy(update={"snapshot_id": state.kv_snapshots.keep(out.engine)})


async def kv_probe(ctx: Context[Any], samples: Samples = 20) -> KvProbeOut:
    """Health-check the KV store: reachable, token, canary round trip, dedup, latency; each
    check pass/fail with a reason. Writes two small probe:* keys. Call it first when KV looks
    wrong."""
    return await _probe(state_of(ctx).kv, samples=samples, write=True)


async def kv_probe_read_only(ctx: Context[Any], samples: Samples = 20) -> KvProbeOut:
    """Health-check the KV store without writing (read-only server): reachable, token
    accepted, p50/p95 latency; each check pass/fail with a reason."""
    return await _probe(state_of(ctx).kv, samples=samples, write=False)


async def kv_get(
    ctx: Context[Any],
    keys: Keys,
    include_value: Annotated[
        bool,
        Field(description="Also return the bytes as base64 (within max_inline_bytes)."),
    ] = False,
    max_inline_bytes: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_INLINE_CAP_BYTES,
            description="Cap on inline value bytes, whole response.",
        ),
    ] = DEFAULT_INLINE_CAP_BYTES,
) -> KvGetManyOut:
    """Read keys: hit or miss, size and sha256; include_value=true adds the bytes as base64 within
    max_inline_bytes (else a note says how to fetch them). A miss is normal."""
    with refused_input("kv_get"):
        check_keys(keys)
    access = state_of(ctx).kv
    kv = await access.connect()
    if isinstance(kv, Unavailable):
        return KvGetManyOut.from_results(
            [KvGetOut(key=key, reachable=False, reason=kv.reason) for key in keys]
        )
    with refused_input("kv_get"):  # the engine's backend may hold keys to a shorter limit
        outcomes = await kv.get_many(keys)
    hint = (
        "run `graph-kvcache-mcp kv get KEY -o FILE` in a shell (this server is read-only)"
        if state_of(ctx).settings.read_only
        else "call kv_save with this key and a new file path"
    )
    budget = max_inline_bytes
    results: list[KvGetOut] = []
    for key, outcome in zip(keys, outcomes, strict=True):
        out = KvGetOut.from_outcome(
            key, outcome, include_value=include_value, inline_cap_bytes=budget, oversize_hint=hint
        )
        if out.value_b64 is not None and out.size_bytes is not None:
            budget -= out.size_bytes
        results.append(out)
    return KvGetManyOut.from_results(results)


async def kv_save(
    ctx: Context[Any],
    key: Key,
    path: Annotated[
        str,
        Field(
            description="Absolute path of a NEW file in the allowed roots (existing directory); "
            "never overwritten."
        ),
    ],
) -> KvGetOut:
    """Write one key's value to a new file (values too big for kv_get); returns its size and sha256.
    Writes nothing on a miss; never overwrites."""
    with refused_input("kv_save"):
        check_key(key)
    target = await new_file_inside_roots(ctx, path, param="path")
    access = state_of(ctx).kv
    kv = await access.connect()
    if isinstance(kv, Unavailable):
        return KvGetOut(key=key, reachable=False, reason=kv.reason)
    with refused_input("kv_save"):
        outcome = await kv.get(key)
    if not isinstance(outcome, Hit):
        return KvGetOut.from_outcome(key, outcome)
    try:
        await anyio.to_thread.run_sync(create_exclusive, target, outcome.value)
    except FileExistsError:
        raise ToolError(
            f"{target} already exists and is never overwritten: choose a new path"
        ) from None
    except OSError as exc:
        raise ToolError(f"could not write {target}: {exc.strerror or exc}") from None
    return KvGetOut.from_outcome(key, outcome, saved_to=str(target))


async def kv_put(
    ctx: Context[Any],
    key: Key,
    value_b64: Annotated[
        str | None,
        Field(description="The bytes as standard padded base64. Give this or file_path."),
    ] = None,
    file_path: Annotated[
        str | None,
        Field(description="Instead: absolute path of a regular file in the allowed roots."),
    ] = None,
) -> KvPutOut:
    """Store bytes (base64 or a file) under a key; echoes size and sha256. The engine keeps
    the FIRST value ever stored: state=already_present means these bytes were NOT stored."""
    with refused_input("kv_put"):
        check_key(key)
        value = await value_from(ctx, value_b64, file_path)
    kv = await state_of(ctx).kv.connect()
    if isinstance(kv, Unavailable):
        return KvPutOut.from_outcome(key, value, kv)
    with refused_input("kv_put"):
        outcome = await kv.put(key, value)
    return KvPutOut.from_outcome(key, value, outcome)


async def kv_exists(ctx: Context[Any], keys: Keys) -> KvExistsOut:
    """Which keys are present (no bytes sent): present true/false per key, or null with a reason
    when the store could not answer."""
    with refused_input("kv_exists"):
        check_keys(keys)
    kv = await state_of(ctx).kv.connect()
    if isinstance(kv, Unavailable):
        return KvExistsOut.from_outcomes(keys, [kv] * len(keys))
    with refused_input("kv_exists"):
        outcomes = await kv.contains_many(keys)
    return KvExistsOut.from_outcomes(keys, outcomes)


# --- helpers -------------------------------------------------------------------------------


async def _probe(access: KvAccess, *, samples: int, write: bool) -> KvProbeOut:
    kv: KvClient | Unavailable = await access.connect()
    if isinstance(kv, Unavailable):
        return KvProbeOut(
            base_url=access.label,
            reachable=False,
            passed=False,
            checks=[ProbeCheck(name="reachable", passed=False, detail=kv.reason)],
            reason=kv.reason,
        )
    return await probe_kv(kv, samples=samples, write=write)


# --- registration --------------------------------------------------------------------------

SPECS = (
    ToolSpec(kv_stats, "KV store stats", READ_ONLY),
    ToolSpec(
        kv_probe,
        "KV store health check",
        WRITES_CANARIES,
        read_only_variant=ToolSpec(kv_probe_read_only, "KV store health check", READ_ONLY),
    ),
    ToolSpec(kv_get, "Read KV keys", READ_ONLY),
    ToolSpec(kv_save, "Save a KV value to a file", CREATES_FILE),
    ToolSpec(kv_put, "Store bytes under a KV key", WRITES_IDEMPOTENT),
    ToolSpec(kv_exists, "Check KV keys exist", READ_ONLY),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
    kv_guide.register(server, stats=stats_out)
