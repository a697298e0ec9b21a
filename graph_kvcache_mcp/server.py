"""`build_server(settings)`: the MCP server. The lifespan owns one `AppState` (shared clients)."""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.mcpserver.exceptions import ResourceError, ToolError

from graph_kvcache_mcp import __version__
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.errors import quoted
from graph_kvcache_mcp.host.catalog import CATALOG, TOOLSET_MODULES, entry_of
from graph_kvcache_mcp.host.registrar import Toolset
from graph_kvcache_mcp.host.strict_server import StrictServer
from graph_kvcache_mcp.host.tasks import TaskRunner
from graph_kvcache_mcp.state import AppState
from graph_kvcache_mcp.tools import toolsets as toolsets_tool

TASK_TOOLS = frozenset(
    {"vllm_start", "vllm_restart_reuse", "cache_warm", "lmcache_start", "engine_start"}
)
"""The tools that can take over ~10 s (a vLLM start takes minutes on CPU): each runs as an MCP
task for a client that opts in to the tasks extension (host/tasks.py), inline for the others."""

REACHABLE = {"kv": "the engine for the KV, engine and bundle cache calls", "vllm": "vLLM for chats"}


def instructions_for(toolsets: Sequence[str], *, read_only: bool = False) -> str:
    """The server's instructions for a model that has the tools of `toolsets` (and no others)."""
    parts = [
        entry.instructions for entry in CATALOG if entry.name in toolsets and entry.instructions
    ]
    if read_only:
        parts.append(
            "This server is read-only: the tools that write, start or stop anything named above "
            "are not registered."
        )
    offered = [name for name in TOOLSET_MODULES if name not in toolsets]
    if "toolsets" in toolsets and offered:
        parts.append(
            f"More toolsets ({', '.join(offered)}): the toolsets tool lists and enables them."
        )
    down = [text for area, text in REACHABLE.items() if _names_endpoint(area, toolsets)]
    if down:
        parts.append(
            "A result with reachable=false means the component that call needs is down ("
            + "; ".join(down)
            + "): report its reason, do not retry in a loop."
        )
    return "\n".join(["Tools to drive and inspect an LLM KV-cache stack.", *parts]) + "\n"


def _names_endpoint(endpoint: str, toolsets: Sequence[str]) -> bool:
    return any(endpoint in entry.endpoints for entry in CATALOG if entry.name in toolsets)


def build_server(settings: Settings) -> StrictServer[AppState]:
    """A server exposing the toolsets `settings` allows (read-only mode drops every writer)."""
    _log_to_stderr()

    @asynccontextmanager
    async def lifespan(app: StrictServer[AppState]) -> AsyncIterator[AppState]:
        state = AppState(settings)
        app.bind_live(state)
        try:
            await state.startup()
            async with tasks.serving():  # background calls end before the state closes
                yield state
        finally:
            try:
                # Shielded: the lifespan ends by cancellation (a signal, a vanished client), and
                # the first checkpoint of an unshielded cleanup would abandon the rest of it,
                # leaving the engine this session started running.
                with anyio.CancelScope(shield=True):
                    await state.aclose()
            finally:
                app.unbind_live(state)
                state.closed.set()

    tasks = TaskRunner(lambda name: name in TASK_TOOLS and name in server.tool_names())
    server: StrictServer[AppState] = StrictServer(
        "graph-kvcache-mcp",
        title="graph-kvcache-mcp",
        version=__version__,
        instructions=instructions_for(settings.toolsets, read_only=settings.read_only),
        lifespan=lifespan,
        extensions=[tasks],
    )
    switch = RuntimeToolsets(server, settings)
    for name in settings.toolsets:
        switch.register(name)
    if "toolsets" in settings.toolsets:
        toolsets_tool.register(server, switch)
    return server


class RuntimeToolsets:
    """The toolsets of one server: registered at start-up, or later through the `toolsets` tool
    (each registered once; an opt-in module is imported only when enabled)."""

    def __init__(self, server: StrictServer[AppState], settings: Settings) -> None:
        self._server = server
        self._settings = settings
        self._enabled: list[str] = []

    def register(self, name: str) -> None:
        module_path = TOOLSET_MODULES.get(name)
        if module_path is None:
            return
        module = importlib.import_module(module_path)
        if not isinstance(module, Toolset):
            raise TypeError(f"{module_path} is not a toolset: it needs TOOLSET and register()")
        read_only = self._settings.read_only
        reason = toolset_refusal(name, self._settings)
        if reason is None:
            module.register(self._server, read_only=read_only)
        else:
            logging.getLogger(__name__).warning("%s", reason)
            module.register(RefusingRegistrar(self._server, reason), read_only=read_only)
        self._enabled.append(name)

    def offered(self) -> list[str]:
        """The toolsets not registered yet."""
        return [name for name in TOOLSET_MODULES if name not in self._enabled]

    def catalog(self) -> list[tuple[str, bool, str]]:
        return [
            (entry.name, entry.name in self._enabled, entry.summary)
            for entry in CATALOG
            if entry.module is not None
        ]

    def enable(self, name: str) -> tuple[list[str], str]:
        if name in self._enabled:
            raise ValueError(
                f"toolset {quoted(name)} is already enabled on this server; its tools are in "
                "tools/list (call toolsets without enable to see every toolset)"
            )
        if name not in TOOLSET_MODULES:
            raise ValueError(
                f"unknown toolset {quoted(name)}; the ones to enable: "
                f"{', '.join(self.offered()) or 'none (all are enabled)'}"
            )
        before = set(self._server.tool_names())
        self.register(name)
        logging.getLogger(__name__).info("enabled the %s toolset at run time", name)
        added = [tool for tool in self._server.tool_names() if tool not in before]
        entry = entry_of(name)
        return added, entry.instructions if entry else ""


def toolset_refusal(toolset: str, settings: Settings) -> str | None:
    """Why `toolset` cannot serve (an endpoint it needs was refused at startup), else None."""
    entry = entry_of(toolset)
    for endpoint in entry.endpoints if entry else ():
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
