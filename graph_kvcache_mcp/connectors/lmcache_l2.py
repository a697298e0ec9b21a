"""Older config path of the L2 adapter, kept for configs that name it. Use `plugins.lmcache.l2`."""

from graph_kvcache_mcp.plugins.lmcache.l2 import EngineL2Client

__all__ = ["EngineL2Client"]
