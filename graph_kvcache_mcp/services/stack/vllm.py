"""vLLM clients whose traces split external hits by tier: by the counters of the lmcache server
the settings name (configured), else the data dir's managed one behind the managed vLLM. vLLM's
lifecycle (status, stop, logs) is `Stack`'s; its start `start.start_vllm`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.stack.tier_counters import attach_lmcache_tier
from graph_kvcache_mcp.connectors.vllm.access import open_client
from graph_kvcache_mcp.services.stack.runtime import lmcache_target

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient


def open_metered_client(settings: Settings, *, base_url: str | None = None) -> VllmClient:
    """A new vLLM client (the caller closes it) whose traces split external hits into L1 and
    L2 when an lmcache server is behind it: the configured one, else the managed one.

    Raises:
        ConfigError: the URL is not http(s), or plain http to a non-loopback host.
    """
    client = open_client(settings, base_url=base_url)
    return attach_lmcache_tier(client, lmcache_target(settings))
