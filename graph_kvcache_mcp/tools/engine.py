"""Engine tools (engine_*): start, stop and check the managed local epistemic-graph engine.

They act on the engine of the server's data dir through the shared `KvAccess`, so the KV tools
follow a started or stopped engine at once. With EPISTEMIC_GRAPH_KVCACHE_URL set they refuse to
start or stop anything (the KV tools use that engine instead).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from graph_kvcache_mcp.connectors.engine.state import EngineStopResult
from graph_kvcache_mcp.domain.lifecycle import ServicePort
from graph_kvcache_mcp.errors import ProcessError
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.stack.store_host import unpublish
from graph_kvcache_mcp.services.stack.views import EngineStatusOut
from graph_kvcache_mcp.tools._common import (
    READ_ONLY,
    STARTS_PROCESS,
    STOPS_PROCESS,
    ToolSpec,
    register_all,
    state_of,
)

TOOLSET = "engine"


async def engine_status(ctx: Context[Any]) -> EngineStatusOut:
    """The managed engine: whether it runs and answers (pid, port, backend, uptime, log), the
    sessions leasing it, which engine the KV tools use, whether it stops on exit."""
    access = state_of(ctx).kv
    try:
        return EngineStatusOut.build(await access.engine_status(), access)
    except ProcessError as exc:  # a platform without /proc
        raise ToolError(str(exc)) from exc


async def engine_start(
    ctx: Context[Any],
    backend: Annotated[
        Literal["durable", "memory"] | None,
        Field(description="durable (default) or memory; ignored if an engine runs."),
    ] = None,
    port: Annotated[
        ServicePort | None, Field(description="Loopback port; default: a free one.")
    ] = None,
) -> EngineStatusOut:
    """Start (or reuse) the managed local engine; returns once it answers. This session holds a
    lease: the engine stops when the last session using it exits (unless --keep-engine)."""
    access = state_of(ctx).kv
    try:
        status = await access.start_engine(backend=backend, port=port)
    except ProcessError as exc:
        raise ToolError(str(exc)) from exc
    return EngineStatusOut.build(status, access)


async def engine_stop(
    ctx: Context[Any],
    force: Annotated[
        bool,
        Field(description="Also stop an engine other sessions use or the CLI started."),
    ] = False,
) -> EngineStopResult:
    """Stop the managed engine (SIGTERM, then SIGKILL; durable data stays). Without force it refuses
    while other sessions lease it or the CLI started it. Signals only what this project started."""
    state = state_of(ctx)
    try:
        before = await state.kv.engine_status()
        result = await state.kv.stop_engine(force=force)
        if result.stopped and before.port is not None:
            # as `engine stop`: an edge route left to a free port would hand on the nodes' token
            await anyio.to_thread.run_sync(unpublish, state.settings, before.port)
    except ProcessError as exc:
        raise ToolError(str(exc)) from exc
    return result


SPECS = (
    ToolSpec(engine_status, "Managed engine status", READ_ONLY),
    ToolSpec(engine_start, "Start the managed engine", STARTS_PROCESS),
    ToolSpec(engine_stop, "Stop the managed engine", STOPS_PROCESS),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
