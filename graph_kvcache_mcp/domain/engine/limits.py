"""The engine's limits and the client's time budget around them, in one place. Pure: no I/O.

Every figure the engine imposes on the `/kv/<key>` surface lives here, so that key checks, the
client, the tools and the docs quote the same numbers. Figures measured on epistemic-graph-server
2.27.7 (see docs/kv-store.md, "Limits").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeAlias

from graph_kvcache_mcp.errors import InvalidValue

EngineBackend: TypeAlias = Literal["memory", "durable"]

VALUE_CAP_BYTES = 64 * 1024 * 1024
"""The engine refuses a request body over 64 MiB (400 `malformed`)."""

DURABLE_FRAME_BYTES = 9
"""The durable backend frames each value with 9 bytes and fails (500) past the same 64 MiB."""

MAX_VALUE_BYTES = VALUE_CAP_BYTES - DURABLE_FRAME_BYTES
"""The largest value both backends store; the client refuses larger ones unsent."""

MAX_REQUEST_TARGET_BYTES = 8192
"""The engine refuses (400) a request target longer than this."""

KV_ROUTE_PREFIX = "/kv/"
EXISTS_ROUTE_SUFFIX = "/exists"

MEMORY_MAX_KEY_BYTES = MAX_REQUEST_TARGET_BYTES - len(KV_ROUTE_PREFIX)
"""8188: the memory backend stores any key that fits the request target."""

DURABLE_MAX_KEY_BYTES = 4096
"""Measured: the durable backend stores and serves 4,096-byte keys; from 4,097 bytes on it answers
500 `StoreError` to the PUT and 404 to the GET (whatever the instance id's length)."""

MAX_KEY_BYTES: Mapping[EngineBackend, int] = {
    "memory": MEMORY_MAX_KEY_BYTES,
    "durable": DURABLE_MAX_KEY_BYTES,
}

KEY_BYTES_ANY_BACKEND = min(MAX_KEY_BYTES.values())
"""A key no longer than this is stored by every backend; past it the backend decides."""

LONGEST_KEY_BYTES = max(MAX_KEY_BYTES.values())
"""No backend stores a longer key."""

MAX_EXISTS_KEY_BYTES = MEMORY_MAX_KEY_BYTES - len(EXISTS_ROUTE_SUFFIX)
"""8181: the `/kv/<key>/exists` route must fit the same request target."""

ENGINE_REQUEST_DEADLINE_S = 15.0
"""The engine answers 400 `malformed` to a request it has not fully received within 15 s."""

MIN_UPLOAD_RATE_BYTES_S = 8 * 1024 * 1024
"""The slowest upload a call's deadline allows for: each byte of request body adds 1/8 MiB s."""


def call_budget_s(timeout_s: float, body_bytes: int = 0) -> float:
    """The deadline of one client call: `timeout_s`, plus upload time at the slowest rate we allow
    for the request bodies it sends (64 MiB adds 8 s), so a large PUT is not cut off mid-upload."""
    return timeout_s + body_bytes / MIN_UPLOAD_RATE_BYTES_S


EMPTY_VALUE = (
    "the value is empty (0 bytes): the engine keeps the first value stored under a key, so an "
    "empty one would stay there and a later put of the real value would answer already_present"
)
EMPTY_VALUE_BY_CLI = (
    "store the real bytes; to store an empty value on purpose, use the CLI: "
    "graph-kvcache-mcp kv put KEY --allow-empty < /dev/null"
)
"""How a tool caller (which cannot opt in) stores an empty value anyway."""


def check_not_empty(value: bytes, *, how_to_allow: str) -> bytes:
    """Return `value` unless it is empty (an empty value spoils its key for good).

    Raises:
        InvalidValue: the value is empty; says why that is refused and `how_to_allow` it.
    """
    if not value:
        raise InvalidValue(f"{EMPTY_VALUE}; {how_to_allow}")
    return value


def check_value(value: bytes) -> bytes:
    """Return `value` when the engine can store it.

    Raises:
        InvalidValue: the value is over the engine's cap; says the cap and how to proceed.
    """
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidValue(
            f"value is {len(value):,} bytes; the engine stores at most {MAX_VALUE_BYTES:,} "
            f"({VALUE_CAP_BYTES // 2**20} MiB - {DURABLE_FRAME_BYTES}) per key: split it into "
            "smaller blocks"
        )
    return value
