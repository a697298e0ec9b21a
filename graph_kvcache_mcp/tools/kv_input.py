"""What KV tools accept from a caller: key aliases, value decoding, file paths. Checks run before
any I/O, and every refusal is a `ToolError` that says what to fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import anyio.to_thread
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from graph_kvcache_mcp.domain.blobs import decode_b64_strict
from graph_kvcache_mcp.domain.engine_limits import (
    DURABLE_MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    MEMORY_MAX_KEY_BYTES,
    check_value,
)
from graph_kvcache_mcp.domain.keys import check_key
from graph_kvcache_mcp.errors import InvalidKey, InvalidValue

MAX_KEYS_PER_CALL = 256
MAX_B64_CHARS = (MAX_VALUE_BYTES + 2) // 3 * 4
"""Length of the padded base64 of the largest value the engine stores."""

Key = Annotated[
    str,
    Field(
        description="Engine key, sent exactly as written: printable ASCII without spaces, '?' or "
        f"'#', at most {DURABLE_MAX_KEY_BYTES} bytes on the durable backend "
        f"({MEMORY_MAX_KEY_BYTES} on the memory one), not an engine route name (stats, version, "
        "snapshot, ...)."
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


async def value_from(value_b64: str | None, file_path: str | None) -> bytes:
    """The bytes to store: from base64 text or from a local file, exactly one of them.

    Raises:
        InvalidValue: neither or both given, bad base64, unusable file, or too large.
    """
    if (value_b64 is None) == (file_path is None):
        raise InvalidValue("give exactly one of value_b64 (base64 text) or file_path")
    if value_b64 is not None:
        return decode_value(value_b64)
    assert file_path is not None
    return await anyio.to_thread.run_sync(read_value_file, file_path)


def read_value_file(file_path: str) -> bytes:
    """Read a regular file by absolute path, refusing one larger than a storable value.

    Raises:
        InvalidValue: relative path, not a regular file, unreadable, or too large.
    """
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


def new_file_path(path: str) -> Path:
    """An absolute path for a file that does not exist yet, in an existing directory.

    Raises:
        ToolError: relative path, missing directory, or the file already exists.
    """
    target = Path(path).expanduser()
    if not target.is_absolute():
        raise ToolError(f"path {path!r} is relative; give an absolute path for the new file")
    if not target.parent.is_dir():
        raise ToolError(f"directory {target.parent} does not exist; create it or pick another")
    if target.exists() or target.is_symlink():
        raise ToolError(f"{target} already exists; kv_save never overwrites: choose a new path")
    return target


def write_new_file(target: Path, value: bytes) -> None:
    """Create `target` (0600) holding `value`; never replaces or follows an existing entry."""
    # O_EXCL: fail rather than follow a symlink or replace a file that appeared meanwhile.
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(value)
    except OSError:
        target.unlink(missing_ok=True)
        raise
