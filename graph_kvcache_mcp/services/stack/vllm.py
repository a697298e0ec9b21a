"""Clients of the managed vLLM whose traces split external hits by tier, for the data dir the
settings name. vLLM's lifecycle (status, stop, logs) is `Stack`'s; its start `start.start_vllm`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.stack.tier_counters import attach_lmcache_tier
from graph_kvcache_mcp.connectors.vllm.access import open_client

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient


def open_metered_client(settings: Settings, *, base_url: str | None = None) -> VllmClient:
    """A new vLLM client (the caller closes it) whose traces split external hits into L1 and
    L2 when the managed lmcache server is behind it.

    Raises:
        ConfigError: the URL is not http(s), or plain http to a non-loopback host.
    """
    return attach_lmcache_tier(open_client(settings, base_url=base_url), settings.data_dir)
