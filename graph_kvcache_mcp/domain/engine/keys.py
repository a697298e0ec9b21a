"""The engine's key rules, in one place. Pure: no I/O.

Keys travel raw in the request target (`/kv/<key>`): the engine never percent-decodes, so a key is
valid only when every byte survives verbatim. Rules as observed on engine 2.27.7 (docs/kv-store.md,
"Key rules"); the length limits come from `domain.engine.limits` and depend on the backend.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from graph_kvcache_mcp.domain.engine.limits import (
    KEY_BYTES_ANY_BACKEND,
    LONGEST_KEY_BYTES,
    MAX_EXISTS_KEY_BYTES,
    MAX_KEY_BYTES,
    EngineBackend,
)
from graph_kvcache_mcp.errors import InvalidKey

KeyBackend: TypeAlias = EngineBackend | Literal["any", "unknown"]
"""Whose length limit a key is held to: a backend's own; "any" for the longest any backend stores
(a check made before the engine is known, the client checks again); "unknown" for an engine that
did not say its backend, held to the limit every backend meets."""

RESERVED_KEYS = frozenset({"stats", "version", "snapshot", "fork/stats"})
RESERVED_PREFIXES = ("version/", "branch/", "snapshot/")
_FORBIDDEN_CHARS = {
    "?": "the engine cuts the key at '?' and drops the rest as a query",
    "#": "HTTP clients strip '#' and everything after it before sending",
    " ": "a space ends the request target",
}
_SHOWN_CHARS = 8  # of a key full of bad characters, name this many distinct ones


def check_key(key: str, *, backend: KeyBackend = "any") -> str:
    """Return `key` unchanged when the engine would store and serve it under exactly that name.

    Raises:
        InvalidKey: names the rule that failed and how to fix the key.
    """
    if not key:
        raise InvalidKey(key, rule="empty", hint="give a non-empty key")
    if problems := _charset_problems(key):
        raise InvalidKey(key, rule="charset", hint="; ".join(problems))
    if len(key) > key_limit(backend):
        raise InvalidKey(key, rule="length", hint=_length_hint(len(key), backend))
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


def _charset_problems(key: str) -> list[str]:
    """Every character rule `key` breaks, each naming all its offending characters at once (a
    key with three bad characters is fixed in one try, not three)."""
    problems = []
    foreign = list(dict.fromkeys(c for c in key if not (c.isascii() and c.isprintable())))
    if foreign:
        shown = ", ".join(repr(c) for c in foreign[:_SHOWN_CHARS])
        more = f" and {len(foreign) - _SHOWN_CHARS} more" if len(foreign) > _SHOWN_CHARS else ""
        problems.append(
            f"remove {shown}{more}: use printable ASCII only (0x21-0x7E); the engine rejects "
            "other bytes"
        )
    problems += [f"remove {c!r}: {why}" for c, why in _FORBIDDEN_CHARS.items() if c in key]
    return problems


def check_exists_key(key: str) -> str:
    """Return `key` when the engine's `/kv/<key>/exists` route can be asked about it: the route's
    suffix shares the request target's limit, so it takes 7 bytes less than a GET does.

    Raises:
        InvalidKey: the key breaks a rule, or is too long for that route.
    """
    check_key(key)
    if len(key) > MAX_EXISTS_KEY_BYTES:
        raise InvalidKey(
            key,
            rule="length",
            hint=f"the /exists route takes keys of at most {MAX_EXISTS_KEY_BYTES} bytes (this key "
            f"has {len(key)}): ask with contains (HEAD) instead",
        )
    return key


def is_valid_key(key: str, *, backend: KeyBackend = "any") -> bool:
    """True when `check_key` would accept `key`."""
    try:
        check_key(key, backend=backend)
    except InvalidKey:
        return False
    return True


def key_limit(backend: KeyBackend) -> int:
    """The longest key (in bytes: keys are ASCII) `backend` is held to."""
    if backend == "any":
        return LONGEST_KEY_BYTES
    if backend == "unknown":
        return KEY_BYTES_ANY_BACKEND
    return MAX_KEY_BYTES[backend]


def _length_hint(size: int, backend: KeyBackend) -> str:
    limit = key_limit(backend)
    if backend == "any":
        whose = "no engine backend stores a longer key"
    elif backend == "unknown":
        whose = (
            "the engine did not report its backend, so keys are held to the limit every backend "
            f"meets (the durable one's; the memory backend takes up to {LONGEST_KEY_BYTES})"
        )
    else:
        whose = f"the engine's {backend} backend stores no longer key"
    return f"use at most {limit} bytes (this key has {size}): {whose}; hash long names"
