"""Fleet tools (fleet_*): several vLLM instances seen together through their KV event feeds.
Opt-in toolset "fleet" (GRAPH_KVCACHE_TOOLSETS); the fleet is GRAPH_KVCACHE_FLEET's file plus a
managed vLLM started with kv_events."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection
from graph_kvcache_mcp.errors import ConfigError, VllmRequestError
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.fleet import operations as fleet_service
from graph_kvcache_mcp.services.fleet.tiers import TierSources
from graph_kvcache_mcp.services.fleet.views import (
    FleetEffectivenessOut,
    FleetStatusOut,
    FleetWhereOut,
)
from graph_kvcache_mcp.tools._common import (
    READ_ONLY,
    ToolSpec,
    register_all,
    snapshot_since,
    state_of,
)

TOOLSET = "fleet"


async def _connection(ctx: Context[Any], tool: str) -> FleetConnection:
    try:
        return await state_of(ctx).fleet.connection()
    except ConfigError as exc:
        raise ToolError(f"{exc}. Then call {tool} again.") from None


async def fleet_status(
    ctx: Context[Any],
    prefixes: Annotated[
        fleet_service.ListedPrefixes, Field(description="Longest prefixes to list.")
    ] = 10,
) -> FleetStatusOut:
    """Each vLLM instance of the fleet: reachable, model, version, block size, hash algorithm,
    prefix caching, KV usage, queue, preemptions, event-feed freshness; findings with fixes where
    instances cannot share; a pressure ranking; and the longest cached prefixes (first tokens
    decoded, length, which instances and media hold them); LMCache L1/L2 memory."""
    conn = await _connection(ctx, "fleet_status")
    return await fleet_service.status(
        conn, prefixes=prefixes, tiers=TierSources(state_of(ctx).settings)
    )


async def fleet_where_cached(
    ctx: Context[Any],
    messages: Annotated[
        list[dict[str, Any]] | None, Field(description="Chat messages (or give prompt).")
    ] = None,
    prompt: Annotated[str | None, Field(description="A completions prompt instead.")] = None,
) -> FleetWhereOut:
    """Per instance, the prompt tokens its next request for these messages (tokenized with its
    own chat template) or prompt would get from its prefix cache, by medium, read from the KV
    event index; the best instance and why. trusted=false: that feed is not live."""
    if (messages is None) == (prompt is None):
        raise ToolError("give exactly one of messages or prompt")
    conn = await _connection(ctx, "fleet_where_cached")
    try:
        return await fleet_service.where_cached(
            conn,
            request=None if messages is None else {"messages": messages},
            prompt=prompt,
            tiers=TierSources(state_of(ctx).settings),
        )
    except VllmRequestError as exc:
        raise ToolError(f"{exc}. Fix the messages and call fleet_where_cached again.") from None


async def fleet_effectiveness(
    ctx: Context[Any],
    since: Annotated[
        str | None, Field(description="snapshot_id of an earlier call; default: since start.")
    ] = None,
) -> FleetEffectivenessOut:
    """Prompt tokens by source (computed, local prefix cache, loaded from the shared tier) per
    instance and for the fleet, with hit rates and the tier's payoff, since an earlier call's
    snapshot_id (or since each instance started)."""
    state = state_of(ctx)
    before = snapshot_since(state.fleet_snapshots, since, "fleet_effectiveness") if since else None
    conn = await _connection(ctx, "fleet_effectiveness")
    out, now = await fleet_service.effectiveness(
        conn,
        before,
        since_id=since,
        data_dir=state.settings.data_dir,
        tiers=TierSources(state.settings),
    )
    return out.model_copy(update={"snapshot_id": state.fleet_snapshots.keep(now)})


SPECS = (
    ToolSpec(fleet_status, "Fleet status, findings, pressure, cached prefixes", READ_ONLY),
    ToolSpec(fleet_where_cached, "Where a prompt's prefix is cached", READ_ONLY),
    ToolSpec(fleet_effectiveness, "What the fleet's caches paid", READ_ONLY),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
