"""`graph_kvcache`: the single action tool agents already call, with the incumbent's meanings.

get -> {hit, value_b64}, put -> {stored}, contains/exists -> {present}, stats -> counters; plus an
output schema, one error shape (ToolError with a message), strict base64 and a 64 KiB inline cap.
The opt-in `compat` toolset (it repeats what kv_get / kv_put / kv_exists / kv_stats do, so the
default list leaves its bytes out); in read-only mode it is registered without the put action.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.domain.blobs import encode_b64, sha256_hex
from graph_kvcache_mcp.domain.engine.keys import check_key
from graph_kvcache_mcp.domain.engine.limits import EMPTY_VALUE_BY_CLI, check_not_empty
from graph_kvcache_mcp.domain.outcomes import Hit, Miss, Unavailable
from graph_kvcache_mcp.errors import InvalidKey, InvalidValue
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.kv.views import DEFAULT_INLINE_CAP_BYTES, KEPT_FIRST_NOTE
from graph_kvcache_mcp.tools._common import (
    READ_ONLY,
    WRITES_IDEMPOTENT,
    ToolSpec,
    read_only_refusal,
    register_all,
    state_of,
)
from graph_kvcache_mcp.tools.kv_input import decode_value

Action = Literal["get", "put", "contains", "exists", "stats"]
TOOLSET = "compat"

ReadAction = Literal["get", "contains", "exists", "stats"]


def _refuse_writes(action: object) -> object:
    if action == "put":
        raise ValueError(read_only_refusal("put"))
    return action


CompatKey = Annotated[
    str | None,
    Field(description="Engine key (every action but stats)."),
]
CompatValue = Annotated[
    str | None,
    Field(description="put: standard padded base64."),
]


class CompatStats(BaseModel):
    """The incumbent's eight counters. null = this backend does not report it (never a fake 0)."""

    model_config = ConfigDict(frozen=True)

    unique_blocks: int | None = None
    total_refs: int | None = None
    resident_bytes: int | None = None
    logical_bytes: int | None = None
    dedup_savings_bytes: int | None = None
    dedup_hits: int | None = None
    get_hits: int | None = None
    get_misses: int | None = None


class GraphKvcacheOut(BaseModel):
    """One action's answer. Only the fields of the action asked are set."""

    model_config = ConfigDict(frozen=True)

    action: Action
    reachable: bool = Field(description="false: the store could not answer; see reason.")
    key: str | None = None
    hit: bool | None = Field(None, description="get: whether the key holds a value.")
    value_b64: str | None = Field(
        None, description="get: the value as base64 when it is at most 64 KiB."
    )
    size_bytes: int | None = Field(None, description="get/put: the value's size.")
    sha256: str | None = Field(None, description="get/put: the value's SHA-256.")
    stored: bool | None = Field(
        None, description="put: the engine acknowledged the PUT (new or already present)."
    )
    state: Literal["stored_new", "already_present"] | None = Field(
        None, description="put: already_present means the engine kept the earlier value."
    )
    present: bool | None = Field(None, description="contains/exists: whether the key exists.")
    stats: CompatStats | None = Field(None, description="stats: the store's counters.")
    backend: str | None = Field(None, description="stats: memory or durable.")
    note: str | None = None
    reason: str | None = Field(None, description="Why the store could not answer.")


async def graph_kvcache(
    ctx: Context[Any],
    action: Annotated[Action, Field(description="What to do.")],
    key: CompatKey = None,
    value_b64: CompatValue = None,
) -> GraphKvcacheOut:
    """The KV store as one tool (for agents written for it): get (value_b64 up to 64 KiB), put
    (already_present: the first value was kept), contains/exists (same answer), stats. Many keys:
    kv_exists."""
    return await _run(ctx, action, key, value_b64)


async def graph_kvcache_read_only(
    ctx: Context[Any],
    action: Annotated[
        ReadAction,
        BeforeValidator(_refuse_writes),  # says why put is missing, not just "should be get, ..."
        Field(description="What to do (no put: read-only)."),
    ],
    key: CompatKey = None,
) -> GraphKvcacheOut:
    """The KV store as one tool, for agents written for it (read-only: no put): get
    (value_b64 up to 64 KiB), contains or exists (same answer), stats. Many keys: kv_exists."""
    return await _run(ctx, action, key, None)


async def _run(
    ctx: Context[Any], action: Action, key: str | None, value_b64: str | None
) -> GraphKvcacheOut:
    try:
        return await _dispatch(ctx, action, key, value_b64)
    except (InvalidKey, InvalidValue) as exc:  # checked here, and by the client per backend
        raise ToolError(f"{exc}. Fix it and call graph_kvcache again.") from exc


async def _dispatch(
    ctx: Context[Any], action: Action, key: str | None, value_b64: str | None
) -> GraphKvcacheOut:
    value = b""
    if action != "stats":
        if key is None:
            raise InvalidValue(f"action={action} needs a key")
        check_key(key)
    if action == "put":
        if value_b64 is None:
            raise InvalidValue("action=put needs value_b64 (standard base64 of the bytes)")
        value = check_not_empty(decode_value(value_b64), how_to_allow=EMPTY_VALUE_BY_CLI)
    state = state_of(ctx)
    kv = await state.kv.connect()
    if isinstance(kv, Unavailable):
        return GraphKvcacheOut(action=action, reachable=False, key=key, reason=kv.reason)
    if action == "stats":
        return await _stats(kv)
    assert key is not None
    if action == "get":
        return await _get(kv, key, read_only=state.settings.read_only)
    if action == "put":
        return await _put(kv, key, value)
    presence = await (kv.contains(key) if action == "contains" else kv.exists(key))
    if isinstance(presence, Unavailable):
        return GraphKvcacheOut(action=action, reachable=False, key=key, reason=presence.reason)
    return GraphKvcacheOut(action=action, reachable=True, key=key, present=presence.present)


async def _stats(kv: KvClient) -> GraphKvcacheOut:
    engine = await kv.engine_stats()
    if isinstance(engine, Unavailable):
        return GraphKvcacheOut(action="stats", reachable=False, reason=engine.reason)
    counters = CompatStats(**engine.model_dump(include=set(CompatStats.model_fields)))
    return GraphKvcacheOut(action="stats", reachable=True, stats=counters, backend=engine.backend)


async def _get(kv: KvClient, key: str, *, read_only: bool) -> GraphKvcacheOut:
    outcome = await kv.get(key)
    match outcome:
        case Unavailable(reason=reason):
            return GraphKvcacheOut(action="get", reachable=False, key=key, reason=reason)
        case Miss():
            return GraphKvcacheOut(action="get", reachable=True, key=key, hit=False)
        case Hit(value=value):
            fits = len(value) <= DEFAULT_INLINE_CAP_BYTES
            fetch = (
                "run `graph-kvcache-mcp kv get KEY -o FILE` in a shell"
                if read_only
                else "call kv_save with this key and a new file path"
            )
            return GraphKvcacheOut(
                action="get",
                reachable=True,
                key=key,
                hit=True,
                value_b64=encode_b64(value) if fits else None,
                size_bytes=len(value),
                sha256=sha256_hex(value),
                note=None
                if fits
                else f"value is {len(value):,} bytes, over the {DEFAULT_INLINE_CAP_BYTES:,}-byte "
                f"inline cap: {fetch}",
            )


async def _put(kv: KvClient, key: str, value: bytes) -> GraphKvcacheOut:
    outcome = await kv.put(key, value)
    digest = {"size_bytes": len(value), "sha256": sha256_hex(value)}
    if isinstance(outcome, Unavailable):
        return GraphKvcacheOut(
            action="put", reachable=False, key=key, reason=outcome.reason, **digest
        )
    return GraphKvcacheOut(
        action="put",
        reachable=True,
        key=key,
        stored=True,
        state=outcome.state,
        note=None if outcome.stored_new else KEPT_FIRST_NOTE,
        **digest,
    )


SPECS = (
    ToolSpec(
        graph_kvcache,
        "Graph KV cache (action tool)",
        WRITES_IDEMPOTENT,
        read_only_variant=ToolSpec(
            graph_kvcache_read_only, "Graph KV cache (action tool, read-only)", READ_ONLY
        ),
    ),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
