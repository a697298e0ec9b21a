"""`build_server(settings)`: the MCP server. The lifespan owns one `AppState` (shared clients)."""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.mcpserver.exceptions import ResourceError, ToolError

from graph_kvcache_mcp import __version__
from graph_kvcache_mcp.config import Endpoint, Settings
from graph_kvcache_mcp.registrar import Toolset
from graph_kvcache_mcp.state import AppState
from graph_kvcache_mcp.strict_server import StrictServer

# Imported only when a server offers the toolset: a host waits for start-up, and the opt-in
# toolsets (lmcache) need not load for a server that does not list them.
TOOLSET_MODULES: dict[str, str] = {
    "kv": "graph_kvcache_mcp.tools.kv",
    "engine": "graph_kvcache_mcp.tools.engine",
    "bundle": "graph_kvcache_mcp.tools.bundle",
    "vllm": "graph_kvcache_mcp.tools.vllm",
    "lmcache": "graph_kvcache_mcp.tools.lmcache",
    "diagnose": "graph_kvcache_mcp.tools.diagnose",
}

TOOLSET_ENDPOINTS: dict[str, tuple[Endpoint, ...]] = {
    "kv": ("kv",),
    "engine": ("kv",),
    "lmcache": ("kv",),
    "bundle": ("kv", "vllm"),
    "vllm": ("vllm",),
}
"""The endpoints each toolset talks to: a refused one disables the toolset, not the server."""

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
Diagnosis (diagnose_*): diagnose_stack checks engine, vLLM and LMCache settings in one call;
diagnose_miss says why a request missed vLLM's prefix cache and how to fix it; diagnose_budget
sizes a model's KV cache from its config.json.
A result with reachable=false means the store is down: report its reason, do not retry in a loop.
"""


def build_server(settings: Settings) -> StrictServer[AppState]:
    """A server exposing the toolsets `settings` allows (read-only mode drops every writer)."""
    _log_to_stderr()

    @asynccontextmanager
    async def lifespan(app: StrictServer[AppState]) -> AsyncIterator[AppState]:
        state = AppState(settings)
        app.bind_live(state)
        try:
            await state.startup()
            yield state
        finally:
            try:
                await state.aclose()
            finally:
                app.unbind_live(state)
                state.closed.set()

    server: StrictServer[AppState] = StrictServer(
        "graph-kvcache-mcp",
        title="graph-kvcache-mcp",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
    )
    for name in settings.toolsets:
        module_path = TOOLSET_MODULES.get(name)
        if module_path is None:
            continue
        module = importlib.import_module(module_path)
        if not isinstance(module, Toolset):
            raise TypeError(f"{module_path} is not a toolset: it needs TOOLSET and register()")
        reason = toolset_refusal(name, settings)
        if reason is None:
            module.register(server, read_only=settings.read_only)
        else:
            logging.getLogger(__name__).warning("%s", reason)
            module.register(RefusingRegistrar(server, reason), read_only=settings.read_only)
    return server


def toolset_refusal(toolset: str, settings: Settings) -> str | None:
    """Why `toolset` cannot serve (an endpoint it needs was refused at startup), else None."""
    for endpoint in TOOLSET_ENDPOINTS.get(toolset, ()):
        if problem := settings.endpoint_problem(endpoint):
            return f"the {toolset} tools are disabled on this server: {problem}"
    return None


class RefusingRegistrar:
    """Stands in for the server while a refused toolset registers: its tools and resources keep
    their names and schemas (so the model sees them and learns why) but answer with the reason,
    and nothing of theirs ever reaches the refused endpoint. Prompts (text only) pass through."""

    def __init__(self, server: StrictServer[AppState], reason: str) -> None:
        self._server = server
        self._reason = reason

    def add_tool(self, fn: Callable[..., Any], **options: Any) -> None:
        reason = self._reason

        @functools.wraps(fn)
        async def refuse(*args: Any, **kwargs: Any) -> Any:
            raise ToolError(f"{reason}. Tell the user; the other tools still work.")

        self._server.add_tool(refuse, **options)

    def resource(self, uri: str, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        reason = self._reason

        def register(fn: Callable[..., Any]) -> Any:
            @functools.wraps(fn)
            async def refuse(*args: Any, **kwargs: Any) -> Any:
                raise ResourceError(reason)

            return self._server.resource(uri, **options)(refuse)

        return register

    def prompt(self, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        return self._server.prompt(**options)

    def withhold(self, name: str, reason: str) -> None:
        self._server.withhold(name, reason)

    def live_state(self) -> AppState | None:
        return self._server.live_state()

    # Deliberately nothing else: a toolset that registers some other way fails loudly here
    # (AttributeError in every test that builds a server) instead of registering a live tool.


def _log_to_stderr() -> None:
    # MCPServer calls logging.basicConfig; configure first so nothing ever lands on stdout.
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
