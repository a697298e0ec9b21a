"""`build_server(settings)`: the MCP server. The lifespan owns one `AppState` (shared clients)."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType
from typing import Any

from mcp.server.mcpserver import MCPServer

from graph_kvcache_mcp import __version__
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.state import AppState, bind_live_state, unbind_live_state
from graph_kvcache_mcp.tools import bundle as bundle_tools
from graph_kvcache_mcp.tools import diagnose as diagnose_tools
from graph_kvcache_mcp.tools import engine as engine_tools
from graph_kvcache_mcp.tools import kv as kv_tools
from graph_kvcache_mcp.tools import lmcache as lmcache_tools
from graph_kvcache_mcp.tools import vllm as vllm_tools

TOOLSET_MODULES: dict[str, ModuleType] = {
    "kv": kv_tools,
    "engine": engine_tools,
    "bundle": bundle_tools,
    "vllm": vllm_tools,
    "lmcache": lmcache_tools,
    "diagnose": diagnose_tools,
}

INSTRUCTIONS = """\
Tools to drive and inspect an LLM KV-cache stack: the epistemic-graph engine's content-addressed
KV store (kv_*, graph_kvcache) and the local engine process (engine_*).
Start with kv_probe to see whether the store is reachable and healthy, then kv_stats for counters
(pass an earlier result's `engine` object as `since` to see what moved). kv_get reads keys (size
and sha256; bytes only when asked and small), kv_save writes one value to a new file, kv_exists
checks many keys at once, kv_put stores bytes: the engine keeps the first value ever stored under
a key, so a repeat PUT reports already_present and changes nothing.
graph_kvcache is the single-tool form older agents call (action=get|put|contains|exists|stats).
With nothing configured the server runs its own local engine (engine_status shows it).
Context bundles (bundle_*): bundle_compile selects evidence under a token budget and caches it by
content (an edit gives a new key); bundle_render and bundle_chat reuse it as a byte-stable prefix.
vLLM (vllm_*): vllm_chat returns the answer and a trace of prompt tokens served from vLLM's
prefix cache (never 0 for unknown: cached_tokens_source says where the count came from);
vllm_metrics reads /metrics (pass `since` for a delta); vllm_start/vllm_status/vllm_stop manage a
local server; vllm_trace_summary sums up this session's calls or a JSONL trace file.
LMCache (lmcache_*, opt-in toolset): lmcache_config generates lmcache server / vLLM / YAML config
with the engine as LMCache's remote tier; lmcache_check validates the adapter against the engine.
Diagnosis (diagnose_*): diagnose_stack checks engine, vLLM and LMCache settings in one call;
diagnose_miss says why a request missed vLLM's prefix cache and how to fix it; diagnose_budget
sizes a model's KV cache from its config.json.
A result with reachable=false means the store is down: report its reason, do not retry in a loop.
"""


def build_server(settings: Settings) -> MCPServer[AppState]:
    """A server exposing the toolsets `settings` allows (read-only mode drops every writer)."""
    _log_to_stderr()

    @asynccontextmanager
    async def lifespan(app: MCPServer[AppState]) -> AsyncIterator[AppState]:
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

    server: MCPServer[AppState] = MCPServer(
        "graph-kvcache-mcp",
        title="graph-kvcache-mcp",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
    )
    for name in settings.toolsets:
        module: Any = TOOLSET_MODULES.get(name)
        if module is not None:
            module.register(server, read_only=settings.read_only)
    return server


def _log_to_stderr() -> None:
    # MCPServer calls logging.basicConfig; configure first so nothing ever lands on stdout.
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
