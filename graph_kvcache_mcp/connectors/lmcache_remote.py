"""Older config path of the in-process remote connector, kept for configs that name it.

Use `graph_kvcache_mcp.plugins.lmcache.remote`. The connector class is made on first access
(it subclasses LMCache's), so this module forwards attribute lookups instead of importing it.
"""

from typing import Any

from graph_kvcache_mcp.plugins.lmcache import remote as _remote


def __getattr__(name: str) -> Any:
    return getattr(_remote, name)
