"""`build_server(settings)`: the MCP server. The lifespan owns one `AppState` (shared clients)."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from graph_kvcache_mcp import __version__
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.state import AppState, bind_live_state, unbind_live_state
from graph_kvcache_mcp.strict_server import StrictServer

# Imported only when a server offers the toolset: a host waits for start-up, and the opt-in
# toolsets (lmcache) need not load for a server that does not list them.
TOOLSET_MODULES: dict[str, str] = {
    "kv": "graph_kvcache_mcp.tools.kv",
    "engine": "graph_kvcache_mcp.tools.engine",
    "bundle": "graph_kvcache_mcp.tools.bundle",
    "vllm": "graph_kvcache_mcp.tools.vllm",
    "lmcache": "graph_kvcache_mcp.tools.lmcache",
}

INSTRUCTIONS = """\
Tools to drive and inspect an LLM KV-cache stack: the epistemic-graph engine's content-addressed
KV store (kv_*, graph_kvcache) and the local engine process (engine_*).
Start with kv_probe to see whether the store is reachable and healthy, then kv_stats for counters
(pass an earlier result's snapshot_id as `since` to see what moved). kv_get reads keys (size
and sha256; bytes only when asked and small), kv_save writes one value to a new file, kv_exists
checks many keys at once, kv_put stores bytes: the engine keeps the first value ever stored under
a key, so a repeat PUT reports already_present and changes nothing.
graph_kvcache is the single-tool form older agents call (action=get|put|contains|exists|stats).
With nothing configured the server runs its own local engine (engine_status shows it).
Context bundles (bundle_*): bundle_compile selects evidence under a token budget and caches it by
content (an edit gives a new key); bundle_render and bundle_chat reuse it as a byte-stable prefix.
vLLM (vllm_*): vllm_chat returns the answer and a trace of prompt tokens served from vLLM's
prefix cache (never 0 for unknown: cached_tokens_source says where the count came from);
vllm_metrics reads /metrics (pass a snapshot_id as `since` for a delta);
vllm_start/vllm_status/vllm_stop manage a local server; vllm_trace_summary sums up this
session's calls or a JSONL trace file.
LMCache (lmcache_*, opt-in toolset): lmcache_config generates lmcache server / vLLM / YAML config
with the engine as LMCache's remote tier; lmcache_check validates the adapter against the engine.
A result with reachable=false means the store is down: report its reason, do not retry in a loop.
"""


def build_server(settings: Settings) -> StrictServer[AppState]:
    """A server exposing the toolsets `settings` allows (read-only mode drops every writer)."""
    _log_to_stderr()

    @asynccontextmanager
    async def lifespan(app: StrictServer[AppState]) -> AsyncIterator[AppState]:
        state = AppState(settings)
        bind_live_state(app, state)
        try:
            await state.startup()
            yield state
        finally:
            try:
                await state.aclose()
            finally:
                unbind_live_state(app, state)
                state.closed.set()

    server: StrictServer[AppState] = StrictServer(
        "graph-kvcache-mcp",
        title="graph-kvcache-mcp",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
    )
    for name in settings.toolsets:
        if name in TOOLSET_MODULES:
            module: Any = importlib.import_module(TOOLSET_MODULES[name])
            module.register(server, read_only=settings.read_only)
    return server


def _log_to_stderr() -> None:
    # MCPServer calls logging.basicConfig; configure first so nothing ever lands on stdout.
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
