"""What the data dir's running stack records about itself, read-only, for the services that
inspect it (diagnosis, kv stats, the fleet's tiers) and the server's tier meter: the stack
service is their one door to the process connectors, so none of them imports one. Where the
lmcache server is (`lmcache_target`) is resolved here once per call; the readers take it.

Reading signals nothing and tidies no state file.
"""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.stack.dependency import dependency_reason as dependency_reason
from graph_kvcache_mcp.connectors.stack.runtime import LmcacheRuntime as LmcacheRuntime
from graph_kvcache_mcp.connectors.stack.runtime import ManagedRuntime as ManagedRuntime
from graph_kvcache_mcp.connectors.stack.runtime import (
    leaked_lmcache_segments as leaked_lmcache_segments,
)
from graph_kvcache_mcp.connectors.stack.runtime import (
    managed_lmcache_runtime as managed_lmcache_runtime,
)
from graph_kvcache_mcp.connectors.stack.runtime import (
    managed_vllm_runtime as managed_vllm_runtime,
)
from graph_kvcache_mcp.connectors.stack.tier_counters import (
    engine_l2_counters as engine_l2_counters,
)
from graph_kvcache_mcp.connectors.stack.tier_counters import server_counters as server_counters
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmState
from graph_kvcache_mcp.domain.targets import Configured, ManagedHere, Target


def lmcache_target(settings: Settings) -> Target:
    """The lmcache server behind the vLLM the tools talk to, resolved once per call: the one
    `GRAPH_KVCACHE_LMCACHE_URL` names (configured: something else runs it), else the data dir's
    managed one (found from its state files as each read needs it)."""
    if settings.lmcache_url is not None:
        return Configured("lmcache server", settings.lmcache_url.rstrip("/"))
    return ManagedHere("lmcache server", settings.data_dir)


def managed_vllm_record(data_dir: Path) -> VllmState | None:
    """The managed vLLM's state record while it runs."""
    return ManagedVllm(data_dir, tidy=False).running_state()


def managed_lmcache_url(data_dir: Path) -> str | None:
    """The HTTP URL of the managed `lmcache server` when one runs."""
    state = ManagedLmcache(data_dir).running_state(tidy=False)
    return None if state is None else state.http_url


def managed_coordinator_url(data_dir: Path) -> str | None:
    """The URL of the coordinator this data dir started (behind our owner-only filter), when
    one runs."""
    state = ManagedCoordinator(data_dir).running_state(tidy=False)
    return None if state is None else state.url
