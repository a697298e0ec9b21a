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
from graph_kvcache_mcp.state import AppState
from graph_kvcache_mcp.tools import kv as kv_tools

TOOLSET_MODULES: dict[str, ModuleType] = {"kv": kv_tools}

INSTRUCTIONS = """\
Tools to drive and inspect an LLM KV-cache stack: the epistemic-graph engine's KV store (kv_*).
Start with kv_probe to see whether the store is reachable; kv_stats for counters. A result with
reachable=false means the store is down: report its reason, do not retry in a loop.
"""


def build_server(settings: Settings) -> MCPServer[AppState]:
    """A server exposing the toolsets `settings` allows (read-only mode drops every writer)."""
    _log_to_stderr()

    @asynccontextmanager
    async def lifespan(_server: MCPServer[AppState]) -> AsyncIterator[AppState]:
        state = AppState(settings)
        try:
            yield state
        finally:
            await state.aclose()

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
