"""What KV tools accept from a caller: key aliases, value decoding, a value from a file (through
`tools.file_paths`, so inside the allowed roots). Checks run before any I/O, and every refusal is
a `ToolError` that says what to fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from graph_kvcache_mcp.domain.blobs import decode_b64_strict
from graph_kvcache_mcp.domain.engine.keys import check_key
from graph_kvcache_mcp.domain.engine.limits import (
    DURABLE_MAX_KEY_BYTES,
    EMPTY_VALUE_BY_CLI,
    MAX_VALUE_BYTES,
    MEMORY_MAX_KEY_BYTES,
    check_not_empty,
    check_value,
)
from graph_kvcache_mcp.errors import InvalidKey, InvalidValue
from graph_kvcache_mcp.tools.file_paths import read_inside_roots

MAX_KEYS_PER_CALL = 256
MAX_B64_CHARS = (MAX_VALUE_BYTES + 2) // 3 * 4
"""Length of the padded base64 of the largest value the engine stores."""

Key = Annotated[
    str,
    Field(
        description="Engine key, sent as written: printable ASCII, no spaces, '?' or '#'; at most "
        f"{DURABLE_MAX_KEY_BYTES} bytes durable, {MEMORY_MAX_KEY_BYTES} memory."
    ),
]
Keys = Annotated[
    list[str],
    Field(
        min_length=1,
        max_length=MAX_KEYS_PER_CALL,
        description="Engine keys: printable ASCII without spaces, '?' or '#'.",
    ),
]


@contextmanager
def refused_input(tool: str) -> Iterator[None]:
    """Turn a caller's mistake (`InvalidKey`, `InvalidValue`) into a ToolError naming the fix."""
    try:
        yield
    except (InvalidKey, InvalidValue) as exc:
        raise ToolError(f"{exc}. Fix it and call {tool} again.") from exc


def check_keys(keys: list[str]) -> list[str]:
    """Every key, checked before any request is sent.

    Raises:
        InvalidKey: the first key that breaks a rule.
    """
    return [check_key(key) for key in keys]


def decode_value(value_b64: str) -> bytes:
    """Strict base64 of a storable value; an oversized text is refused before decoding.

    Raises:
        InvalidValue: not standard padded base64, or larger than the engine stores.
    """
    if len(value_b64) > MAX_B64_CHARS:
        raise InvalidValue(
            f"value_b64 is {len(value_b64):,} characters, more than the base64 of the largest "
            f"value the engine stores ({MAX_VALUE_BYTES:,} bytes): split it into smaller blocks"
        )
    return check_value(decode_b64_strict(value_b64))


async def value_from(ctx: Context[Any], value_b64: str | None, file_path: str | None) -> bytes:
    """The bytes to store: from base64 text or from a file inside the allowed roots, exactly one.

    Raises:
        InvalidValue: neither or both given, bad base64, empty, or too large.
        ToolError: the file is outside the allowed roots, not a regular file, or too large.
    """
    if (value_b64 is None) == (file_path is None):
        raise InvalidValue("give exactly one of value_b64 (base64 text) or file_path")
    if value_b64 is not None:
        return check_not_empty(decode_value(value_b64), how_to_allow=EMPTY_VALUE_BY_CLI)
    assert file_path is not None
    value = await read_inside_roots(ctx, file_path, param="file_path", max_bytes=MAX_VALUE_BYTES)
    return check_not_empty(value, how_to_allow=EMPTY_VALUE_BY_CLI)
