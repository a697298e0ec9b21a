"""LMCache key strings → engine keys. Pure: no I/O.

LMCache names a chunk with a string such as `Qwen/Qwen3-8B@01000100@0@<chunk hash hex>` (MP mode)
or `Qwen/Qwen3-8B@1@0@<hash>@bfloat16` (in-process mode). Those carry '/' and '@', can grow past
the engine's key limit with a long cache salt, and could in principle collide with the engine's
reserved routes. So a block is stored under a fixed-size digest instead:

    engine key = "lmc1:" + sha256(namespace + "\\n" + "v1" + "\\n" + LMCache key).hexdigest()

The whole LMCache string is hashed, not just its chunk hash: model, rank, object group, dtype, tags
and cache salt are all part of it, so deployments that must not share blocks never do. The
namespace lets operators keep fleets apart on one engine (or start afresh) without touching
LMCache; the scheme version changes only if this mapping ever does.
`graph-kvcache-mcp lmcache key <LMCACHE_KEY>` prints the engine key for one LMCache key.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

from pydantic import Field

from graph_kvcache_mcp.errors import ConfigError

KEY_SCHEME_VERSION = 1
ENGINE_KEY_PREFIX = f"lmc{KEY_SCHEME_VERSION}:"
DEFAULT_NAMESPACE = "lmcache"
MAX_NAMESPACE_CHARS = 128
Namespace = Annotated[str, Field(min_length=1, max_length=MAX_NAMESPACE_CHARS)]
"""A key namespace (`check_namespace` adds the printable-ASCII rule)."""


def check_namespace(namespace: str) -> str:
    """Return `namespace` when it can be part of the mapping.

    Raises:
        ConfigError: the namespace is empty, too long, or not printable ASCII.
    """
    if not namespace:
        raise ConfigError("LMCache key namespace is empty: give a short name such as 'lmcache'")
    if len(namespace) > MAX_NAMESPACE_CHARS:
        raise ConfigError(
            f"LMCache key namespace is {len(namespace)} characters; use at most "
            f"{MAX_NAMESPACE_CHARS}"
        )
    if not (namespace.isascii() and namespace.isprintable()):
        raise ConfigError(
            "LMCache key namespace must be printable ASCII (it is hashed into every engine key)"
        )
    return namespace


def engine_key(lmcache_key: str, *, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The engine key that stores the LMCache chunk named `lmcache_key` (see module docstring).

    Raises:
        ConfigError: `namespace` is unusable.
        ValueError: `lmcache_key` is empty.
    """
    if not lmcache_key:
        raise ValueError("LMCache key is empty")
    check_namespace(namespace)
    material = f"{namespace}\nv{KEY_SCHEME_VERSION}\n{lmcache_key}".encode()
    return ENGINE_KEY_PREFIX + hashlib.sha256(material).hexdigest()


def engine_keys(lmcache_keys: list[str], *, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """`engine_key` for each key, in order (the namespace is checked once)."""
    check_namespace(namespace)
    prefix = f"{namespace}\nv{KEY_SCHEME_VERSION}\n"
    out = []
    for key in lmcache_keys:
        if not key:
            raise ValueError("LMCache key is empty")
        out.append(ENGINE_KEY_PREFIX + hashlib.sha256((prefix + key).encode()).hexdigest())
    return out
