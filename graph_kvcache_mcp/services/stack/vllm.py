"""The managed vLLM from the CLI (`vllm status|stop|logs`, and clients whose traces split
external hits by tier), for the data dir the settings name. A server session has the same
through its `VllmAccess` (`state.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.stack.tier_counters import attach_lmcache_tier
from graph_kvcache_mcp.connectors.vllm.access import open_client
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmLogs, VllmStopResult
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.services.vllm import operations as vllm_service
from graph_kvcache_mcp.services.vllm.views import VllmStatusOut

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient


def open_metered_client(settings: Settings, *, base_url: str | None = None) -> VllmClient:
    """A new vLLM client (the caller closes it) whose traces split external hits into L1 and
    L2 when the managed lmcache server is behind it.

    Raises:
        ConfigError: the URL is not http(s), or plain http to a non-loopback host.
    """
    return attach_lmcache_tier(open_client(settings, base_url=base_url), settings.data_dir)


def managed_vllm(settings: Settings) -> ManagedVllm:
    """The data dir's vLLM, started (and restarted) with the configured interpreter."""
    return ManagedVllm(settings.data_dir, python=settings.vllm_python)


def vllm_status(settings: Settings) -> VllmStatusOut:
    """The managed vLLM, or whatever answers on the configured port.

    Raises:
        ConfigError: VLLM_BASE_URL is not an http(s) URL.
    """
    port = parse_http_url(settings.vllm_base_url, what="VLLM_BASE_URL").port
    return vllm_service.status(
        ManagedVllm(settings.data_dir), port=port, tools_base_url=settings.vllm_base_url
    )


def stop_vllm(settings: Settings, *, wait_s: float) -> VllmStopResult:
    """Stop the vLLM this data dir started (its lmcache server, if any, runs on)."""
    return vllm_service.stop(ManagedVllm(settings.data_dir), wait_s=wait_s)


def vllm_logs(settings: Settings, *, lines: int) -> VllmLogs:
    """The last `lines` of the managed vLLM's log."""
    return vllm_service.logs(ManagedVllm(settings.data_dir), lines=lines)
