"""KV store tools (kv_*): stats, probe, get, save, put, exists; the kv://stats resource and the
diagnose_kv_cache prompt. Thin adapters over services/ and the shared `KvAccess`.

Bad input (keys, base64, sizes, paths) is refused with `ToolError` before any I/O, so nothing is
stored and no engine is started for a call that cannot succeed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from graph_kvcache_mcp.connectors.kv_access import KvAccess
from graph_kvcache_mcp.connectors.kv_http import MAX_VALUE_BYTES, KvClient, check_value
from graph_kvcache_mcp.domain.blobs import decode_b64_strict
from graph_kvcache_mcp.domain.keys import check_key
from graph_kvcache_mcp.domain.kv_stats import EngineStats, stats_delta
from graph_kvcache_mcp.domain.outcomes import Hit, Unavailable
from graph_kvcache_mcp.errors import InvalidKey, InvalidValue
from graph_kvcache_mcp.services.kv_probe import KvProbeOut, ProbeCheck, probe_kv
from graph_kvcache_mcp.services.kv_views import (
    DEFAULT_INLINE_CAP_BYTES,
    KvExistsOut,
    KvGetManyOut,
    KvGetOut,
    KvPutOut,
    KvStatsOut,
)
from graph_kvcache_mcp.state import live_state
from graph_kvcache_mcp.tools import compat
from graph_kvcache_mcp.tools._common import (
    READ_ONLY,
    WRITES_IDEMPOTENT,
    ToolSpec,
    register_all,
    state_of,
)

TOOLSET = "kv"

MAX_KEYS_PER_CALL = 256
MAX_INLINE_CAP_BYTES = 1024 * 1024
# Each probe writes two fresh canary keys: harmless, but not read-only and not idempotent.
WRITES_CANARIES = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
# kv_save creates a file the caller names; it never overwrites one.
CREATES_FILE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)

Key = Annotated[
    str,
    Field(
        description="Engine key, sent exactly as written: printable ASCII without spaces, '?' or "
        "'#', at most 8188 bytes, not an engine route name (stats, version, snapshot, ...)."
    ),
]
Keys = Annotated[
    list[str],
    Field(
        min_length=1,
        max_length=MAX_KEYS_PER_CALL,
        description=f"One or more engine keys (at most {MAX_KEYS_PER_CALL}), same rules as `key`.",
    ),
]
Samples = Annotated[
    int, Field(ge=1, le=500, description="How many small HEAD requests to time for latency.")
]


@contextmanager
def refused_input(tool: str) -> Iterator[None]:
    """Turn a caller's mistake into a ToolError the model can act on."""
    try:
        yield
    except (InvalidKey, InvalidValue) as exc:
        raise ToolError(f"{exc}. Fix it and call {tool} again.") from exc


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
        for key in keys:
            check_key(key)
    access = state_of(ctx).kv
    kv = await access.connect()
    if isinstance(kv, Unavailable):
        return KvGetManyOut.from_results(
            [KvGetOut(key=key, reachable=False, reason=kv.reason) for key in keys]
        )
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
    target = _new_file_path(path)
    access = state_of(ctx).kv
    kv = await access.connect()
    if isinstance(kv, Unavailable):
        return KvGetOut(key=key, reachable=False, reason=kv.reason)
    outcome = await kv.get(key)
    if not isinstance(outcome, Hit):
        return KvGetOut.from_outcome(key, outcome)
    try:
        await anyio.to_thread.run_sync(_write_new_file, target, outcome.value)
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
        value = await _value_from(value_b64, file_path)
        check_value(value)
    kv = await state_of(ctx).kv.connect()
    if isinstance(kv, Unavailable):
        return KvPutOut.from_outcome(key, value, kv)
    return KvPutOut.from_outcome(key, value, await kv.put(key, value))


async def kv_exists(ctx: Context[Any], keys: Keys) -> KvExistsOut:
    """Check which of many keys are present (HEAD requests, no bytes transferred). Each result
    is present true/false, or null with a reason when the store could not answer for it."""
    with refused_input("kv_exists"):
        for key in keys:
            check_key(key)
    kv = await state_of(ctx).kv.connect()
    if isinstance(kv, Unavailable):
        return KvExistsOut.from_outcomes(keys, [kv] * len(keys))
    return KvExistsOut.from_outcomes(keys, await kv.contains_many(keys))


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


async def _value_from(value_b64: str | None, file_path: str | None) -> bytes:
    if (value_b64 is None) == (file_path is None):
        raise InvalidValue("give exactly one of value_b64 (base64 text) or file_path")
    if value_b64 is not None:
        # Refuse before decoding: base64 of the largest storable value is 4/3 of it, padded.
        if len(value_b64) > (MAX_VALUE_BYTES + 2) // 3 * 4:
            raise InvalidValue(
                f"value_b64 is {len(value_b64):,} characters, more than the base64 of the "
                f"largest value the engine stores ({MAX_VALUE_BYTES:,} bytes): split it"
            )
        return decode_b64_strict(value_b64)
    assert file_path is not None
    return await anyio.to_thread.run_sync(_read_file, file_path)


def _read_file(file_path: str) -> bytes:
    path = Path(file_path).expanduser()
    if not path.is_absolute():
        raise InvalidValue(f"file_path {file_path!r} is relative; give an absolute path")
    if not path.is_file():
        raise InvalidValue(f"file_path {file_path!r} is not an existing regular file")
    size = path.stat().st_size
    if size > MAX_VALUE_BYTES:
        raise InvalidValue(
            f"{file_path} is {size:,} bytes; the engine stores at most {MAX_VALUE_BYTES:,} "
            "(64 MiB - 9) per key: split it into smaller blocks"
        )
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidValue(f"cannot read {file_path}: {exc.strerror or exc}") from None


def _new_file_path(path: str) -> Path:
    target = Path(path).expanduser()
    if not target.is_absolute():
        raise ToolError(f"path {path!r} is relative; give an absolute path for the new file")
    if not target.parent.is_dir():
        raise ToolError(f"directory {target.parent} does not exist; create it or pick another")
    if target.exists() or target.is_symlink():
        raise ToolError(f"{target} already exists; kv_save never overwrites: choose a new path")
    return target


def _write_new_file(target: Path, value: bytes) -> None:
    # O_EXCL: fail rather than follow a symlink or replace a file that appeared meanwhile.
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(value)
    except OSError:
        target.unlink(missing_ok=True)
        raise


# --- resource and prompt -------------------------------------------------------------------

DIAGNOSE_PROMPT = """\
Diagnose this server's KV cache store step by step, and report plainly.
{symptom_line}
1. Call kv_probe. If reachable is false, stop: quote its reason and the fix it names (start the
   engine with engine_start, set EPISTEMIC_GRAPH_KVCACHE_URL, or fix the token). If a check failed,
   quote that check's detail.
2. Call kv_stats. Note the backend: the memory backend reports occupancy (unique_blocks,
   resident_bytes, logical_bytes) but never counts gets; the durable backend counts hits and misses
   but not occupancy. A null field means "not reported", not zero.
3. Interpret:
   - hit_rate: low with hit_rate_source=engine means readers ask for keys nobody stored (check the
     key convention: keys are raw, never percent-encoded); source=client covers only this server.
   - dedup_hit_share / dedup_ratio: high means many writers store the same blocks (good reuse);
     zero after a repeated workload means keys differ between runs (volatile bytes in the key).
   - errors in the client counters: the store failed requests; the probe's details say why.
4. To measure a workload, keep kv_stats' `engine` object, run it, then call kv_stats with
   since=<that object> and report `delta`.
Finish with: status (healthy / degraded / down), the evidence, and the next action.
"""


def diagnose_kv_cache(symptom: str = "") -> str:
    """Walk through kv_probe -> kv_stats -> interpretation of the KV cache store."""
    line = f"Reported symptom: {symptom.strip()}\n" if symptom.strip() else ""
    return DIAGNOSE_PROMPT.format(symptom_line=line)


def _register_stats_resource(server: MCPServer[Any]) -> None:
    async def kv_stats_resource() -> str:
        state = live_state(server)
        if state is None:
            raise ResourceError("server is not running; connect a client first")
        return (await stats_out(state.kv)).model_dump_json(indent=2)

    server.resource(
        "kv://stats",
        name="kv_stats",
        title="KV store stats",
        description="Current normalized KV store stats as JSON (same shape as kv_stats).",
        mime_type="application/json",
    )(kv_stats_resource)


# --- registration --------------------------------------------------------------------------

SPECS = (
    ToolSpec(kv_stats, "KV store stats", READ_ONLY),
    ToolSpec(kv_probe, "KV store health check", WRITES_CANARIES),
    ToolSpec(kv_get, "Read KV keys", READ_ONLY),
    ToolSpec(kv_save, "Save a KV value to a file", CREATES_FILE),
    ToolSpec(kv_put, "Store bytes under a KV key", WRITES_IDEMPOTENT),
    ToolSpec(kv_exists, "Check KV keys exist", READ_ONLY),
)
READ_ONLY_SPECS = (
    ToolSpec(kv_stats, "KV store stats", READ_ONLY),
    ToolSpec(kv_probe_read_only, "KV store health check", READ_ONLY, name="kv_probe"),
    ToolSpec(kv_get, "Read KV keys", READ_ONLY),
    ToolSpec(kv_exists, "Check KV keys exist", READ_ONLY),
)


def register(server: MCPServer[Any], *, read_only: bool) -> None:
    register_all(server, READ_ONLY_SPECS if read_only else SPECS, read_only=read_only)
    compat.register(server, read_only=read_only)
    _register_stats_resource(server)
    server.prompt(
        name="diagnose_kv_cache",
        title="Diagnose the KV cache",
        description="Walks a model through kv_probe, kv_stats and what the numbers mean.",
    )(diagnose_kv_cache)
