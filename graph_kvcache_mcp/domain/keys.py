"""The engine's key rules, in one place. Pure: no I/O.

Keys travel raw in the request target (`/kv/<key>`): the engine never percent-decodes, so a key is
valid only when every byte survives verbatim. Rules as observed on engine 2.27.7
(docs/kv-store.md, "Key rules").
"""

from __future__ import annotations

from graph_kvcache_mcp.errors import InvalidKey

MAX_KEY_BYTES = 8188
"""The request target is capped at 8192 bytes, and `/kv/` takes four of them."""

RESERVED_KEYS = frozenset({"stats", "version", "snapshot", "fork/stats"})
RESERVED_PREFIXES = ("version/", "branch/", "snapshot/")
_FORBIDDEN_CHARS = "?# "


def check_key(key: str) -> str:
    """Return `key` unchanged when the engine would store and serve it under exactly that name.

    Raises:
        InvalidKey: names the rule that failed and how to fix the key.
    """
    if not key:
        raise InvalidKey(key, rule="empty", hint="give a non-empty key")
    if not (key.isascii() and key.isprintable()):
        raise InvalidKey(
            key,
            rule="charset",
            hint="use printable ASCII only (0x21-0x7E); the engine rejects other bytes",
        )
    for char in _FORBIDDEN_CHARS:
        if char in key:
            why = {
                "?": "the engine cuts the key at '?' and drops the rest as a query",
                "#": "HTTP clients strip '#' and everything after it before sending",
                " ": "a space ends the request target",
            }[char]
            raise InvalidKey(key, rule="charset", hint=f"remove {char!r}: {why}")
    if len(key.encode("ascii")) > MAX_KEY_BYTES:
        raise InvalidKey(
            key,
            rule="length",
            hint=f"use at most {MAX_KEY_BYTES} bytes (this key has {len(key)}); hash long names",
        )
    if key in RESERVED_KEYS or key.startswith(RESERVED_PREFIXES):
        raise InvalidKey(
            key,
            rule="reserved",
            hint="this name is one of the engine's own routes (stats, version, snapshot, "
            "fork/stats, version/..., branch/..., snapshot/...); add a prefix such as 'blk:'",
        )
    if key.endswith("/exists"):
        raise InvalidKey(
            key,
            rule="exists-suffix",
            hint="a key ending in '/exists' is answered by the existence route and never stored; "
            "rename it",
        )
    return key


def is_valid_key(key: str) -> bool:
    """True when `check_key` would accept `key`."""
    try:
        check_key(key)
    except InvalidKey:
        return False
    return True
