"""Cache steering tools (cache_*): warm, evict and pin one prompt's chunks on one fleet instance's
LMCache server, through LMCache's coordinator. Opt-in toolset "cache"; every tool writes, so none
is served read-only."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import ConfigError, VllmRequestError
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.cache import operations as cache_service
from graph_kvcache_mcp.services.cache.operations import CacheOut, CacheTarget
from graph_kvcache_mcp.services.fleet.tiers import TierSources
from graph_kvcache_mcp.tools._common import WRITES_IDEMPOTENT, ToolSpec, register_all, state_of

TOOLSET = "cache"
EVICTS = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)
Instance = Annotated[str, Field(description="Fleet instance whose LMCache server to act on.")]
Messages = Annotated[
    list[dict[str, Any]] | None, Field(description="Chat messages (or give prompt).")
]
Prompt = Annotated[str | None, Field(description="A completions prompt instead.")]


async def _target(
    ctx: Context[Any], tool: str, instance: str, messages: Messages, prompt: Prompt
) -> CacheTarget | CacheOut:
    if (messages is None) == (prompt is None):
        raise ToolError("give exactly one of messages or prompt")
    state = state_of(ctx)
    try:
        conn = await state.fleet.connection()
        target = await cache_service.resolve_target(
            conn,
            TierSources(state.settings),
            instance,
            request=None if messages is None else {"messages": messages},
            prompt=prompt,
        )
    except (ConfigError, VllmRequestError) as exc:
        raise ToolError(f"{exc}. Then call {tool} again.") from None
    if isinstance(target, Unavailable):
        return CacheOut(instance=instance, done=False, reason=target.reason)
    return target


async def cache_warm(
    ctx: Context[Any],
    instance: Instance,
    messages: Messages = None,
    prompt: Prompt = None,
    timeout_s: Annotated[float, Field(gt=0, le=300, description="How long to wait.")] = 30.0,
) -> CacheOut:
    """Copy a prompt's chunks from L2 (the engine) into the instance's LMCache L1 and wait:
    found/chunks say how much was there. Its next request then loads from L1."""
    target = await _target(ctx, "cache_warm", instance, messages, prompt)
    if isinstance(target, CacheOut):
        return target
    return await cache_service.warm(instance, target, timeout_s=timeout_s)


async def cache_evict(
    ctx: Context[Any],
    instance: Instance,
    messages: Messages = None,
    prompt: Prompt = None,
    tier: Annotated[Literal["l1", "l2"], Field(description="l1, or l2 (never deleted).")] = "l1",
) -> CacheOut:
    """Drop a prompt's chunks from the instance's LMCache L1. tier=l2 deletes nothing and says
    what can delete there in this mode."""
    target = await _target(ctx, "cache_evict", instance, messages, prompt)
    if isinstance(target, CacheOut):
        return target
    return await cache_service.evict(instance, target, tier=tier)


async def cache_pin(
    ctx: Context[Any], instance: Instance, messages: Messages = None, prompt: Prompt = None
) -> CacheOut:
    """Pin a prompt's L2 keys in the coordinator; note says what a pin does not protect."""
    target = await _target(ctx, "cache_pin", instance, messages, prompt)
    if isinstance(target, CacheOut):
        return target
    return await cache_service.pin(instance, target, on=True)


async def cache_unpin(
    ctx: Context[Any], instance: Instance, messages: Messages = None, prompt: Prompt = None
) -> CacheOut:
    """Remove one pin from a prompt's L2 keys in the coordinator."""
    target = await _target(ctx, "cache_unpin", instance, messages, prompt)
    if isinstance(target, CacheOut):
        return target
    return await cache_service.pin(instance, target, on=False)


SPECS = (
    ToolSpec(cache_warm, "Warm a prompt into an instance's LMCache L1", WRITES_IDEMPOTENT),
    ToolSpec(cache_evict, "Evict a prompt from an instance's LMCache L1", EVICTS),
    ToolSpec(cache_pin, "Pin a prompt's L2 keys (coordinator)", WRITES_IDEMPOTENT),
    ToolSpec(cache_unpin, "Unpin a prompt's L2 keys (coordinator)", EVICTS),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
