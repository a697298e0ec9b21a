"""KV store tools (kv_*): stats, probe, get, save, put, exists. Thin adapters over services/ and
the shared `KvAccess`; registering the toolset also adds graph_kvcache and the kv guides.

Bad input (keys, base64, sizes, paths) is refused with `ToolError` before any I/O, so nothing is
stored and no engine is started for a call that cannot succeed.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from graph_kvcache_mcp.connectors.kv_access import KvAccess
from graph_kvcache_mcp.connectors.kv_http import KvClient
from graph_kvcache_mcp.domain.keys import check_key
from graph_kvcache_mcp.domain.kv_stats import EngineStats, stats_delta
from graph_kvcache_mcp.domain.outcomes import Hit, Unavailable
from graph_kvcache_mcp.services.kv_probe import KvProbeOut, ProbeCheck, probe_kv
from graph_kvcache_mcp.services.kv_views import (
    DEFAULT_INLINE_CAP_BYTES,
    KvExistsOut,
    KvGetManyOut,
    KvGetOut,
    KvPutOut,
    KvStatsOut,
)
from graph_kvcache_mcp.tools import compat, kv_guide
from graph_kvcache_mcp.tools._common import (
    READ_ONLY,
    WRITES_IDEMPOTENT,
    ToolSpec,
    register_all,
    state_of,
)
from graph_kvcache_mcp.tools.kv_input import (
    Key,
    Keys,
    check_keys,
    new_file_path,
    refused_input,
    value_from,
    write_new_file,
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

Samples = Annotated[
    int, Field(ge=1, le=500, description="How many small HEAD requests to time for latency.")
]


async def stats_out(access: KvAccess, since: EngineStats | None = None) -> KvStatsOut:
    """kv_stats' result (also served as the kv://stats resource)."""
    kv = await access.connect()
    if isinstance(kv, Unavailable):
        return KvStatsOut(reachable=False, base_url=access.label, reason=kv.reason)
    out = KvStatsOut.from_outcome(kv.base_url, await kv.stats())
    if since is None or out.engine is None:
        return out
    if since.backend != out.engine.backend:
        raise ToolError(
            f"`since` is a snapshot of a {since.backend} backend but this store is "
            f"{out.engine.backend}: pass the `engine` object of an earlier kv_stats result "
            "from this store"
        )
    return out.model_copy(update={"delta": stats_delta(since, out.engine)})


# --- tools ---------------------------------------------------------------------------------


async def kv_stats(
    ctx: Context[Any],
    since: Annotated[
        EngineStats | None,
        Field(
            description="Optional: the `engine` object of an earlier kv_stats result; the answer "
            "then also holds `delta`, what each engine counter moved since then."
        ),
    ] = None,
) -> KvStatsOut:
    """Report the engine KV store's normalized counters: which backend (memory or durable),
    blocks, bytes, dedup hits, hit rate (from the engine when it counts gets, else from this
    server's own client counters), plus this server's client counters. A counter the backend does
    not report is null, never 0. To see what a workload changed, call once, keep `engine`, run the
    workload, then call again with since=<that engine object>. reachable=false means the store is
    down: report the reason instead of retrying."""
    return await stats_out(state_of(ctx).kv, since)


async def kv_probe(ctx: Context[Any], samples: Samples = 20) -> KvProbeOut:
    """Health-check the KV store, each check pass/fail with a reason: reachable, token accepted,
    a canary PUT/GET round trip returns the same bytes, a repeat PUT moves the engine's dedup
    counter, and p50/p95 latency of small requests. Writes two 64-byte canary blocks under
    probe:<random> (the engine has no delete). Call it first when anything KV-related looks
    wrong; a failed check's detail says what to fix."""
    return await _probe(state_of(ctx).kv, samples=samples, write=True)


async def kv_probe_read_only(ctx: Context[Any], samples: Samples = 20) -> KvProbeOut:
    """Health-check the KV store without writing anything (this server is read-only): reachable,
    token accepted, and p50/p95 latency of small requests, each with pass/fail and a reason.
    The round-trip and dedup checks need writes and are skipped here."""
    return await _probe(state_of(ctx).kv, samples=samples, write=False)


async def kv_get(
    ctx: Context[Any],
    keys: Keys,
    include_value: Annotated[
        bool,
        Field(description="Return the bytes as base64 too (only while they fit the inline cap)."),
    ] = False,
    max_inline_bytes: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_INLINE_CAP_BYTES,
            description="Inline cap for the whole response, in bytes of value (before base64).",
        ),
    ] = DEFAULT_INLINE_CAP_BYTES,
) -> KvGetManyOut:
    """Look up one or many keys. Each result says hit or miss, the value's size and sha256, and -
    only with include_value=true and while the response stays under max_inline_bytes - the bytes
    as standard base64. A value that does not fit is not returned; its note says how to fetch it
    (kv_save writes it to a file). A miss is normal (the key was never stored); reachable=false
    means the store is down: report the reason instead of retrying."""
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
            description="Absolute path of a NEW file to write the value to; its directory must "
            "exist. An existing file is never overwritten."
        ),
    ],
) -> KvGetOut:
    """Write one key's value to a new file and report its size and sha256 (for values too large
    to return inline from kv_get). On a miss nothing is written. Refuses relative paths, missing
    directories and existing files."""
    with refused_input("kv_save"):
        check_key(key)
    target = new_file_path(path)
    access = state_of(ctx).kv
    kv = await access.connect()
    if isinstance(kv, Unavailable):
        return KvGetOut(key=key, reachable=False, reason=kv.reason)
    with refused_input("kv_save"):
        outcome = await kv.get(key)
    if not isinstance(outcome, Hit):
        return KvGetOut.from_outcome(key, outcome)
    try:
        await anyio.to_thread.run_sync(write_new_file, target, outcome.value)
    except FileExistsError:
        raise ToolError(
            f"{target} already exists; kv_save never overwrites: choose a new path"
        ) from None
    except OSError as exc:
        raise ToolError(f"could not write {target}: {exc.strerror or exc}") from None
    return KvGetOut.from_outcome(key, outcome, saved_to=str(target))


async def kv_put(
    ctx: Context[Any],
    key: Key,
    value_b64: Annotated[
        str | None,
        Field(
            description="The bytes as standard, padded base64 ('+' and '/'; no URL-safe alphabet, "
            "no line breaks). Give this or file_path."
        ),
    ] = None,
    file_path: Annotated[
        str | None,
        Field(description="Absolute path of a local file whose bytes to store, instead of base64."),
    ] = None,
) -> KvPutOut:
    """Store bytes under a key. The engine keeps the FIRST value ever stored under a key: state
    stored_new means these bytes are now stored; already_present means the key existed and these
    bytes were NOT stored (the engine only counted a dedup hit). Echoes size and sha256 so the
    caller can verify. Values are capped at 64 MiB - 9 bytes."""
    with refused_input("kv_put"):
        check_key(key)
        value = await value_from(value_b64, file_path)
    kv = await state_of(ctx).kv.connect()
    if isinstance(kv, Unavailable):
        return KvPutOut.from_outcome(key, value, kv)
    with refused_input("kv_put"):
        outcome = await kv.put(key, value)
    return KvPutOut.from_outcome(key, value, outcome)


async def kv_exists(ctx: Context[Any], keys: Keys) -> KvExistsOut:
    """Check which of many keys are present (HEAD requests, no bytes transferred). Each result
    is present true/false, or null with a reason when the store could not answer for it."""
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


def register(server: MCPServer[Any], *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
    compat.register(server, read_only=read_only)
    kv_guide.register(server, stats=stats_out)
