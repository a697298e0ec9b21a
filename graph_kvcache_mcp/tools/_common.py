"""What every toolset shares: annotation presets, the lifespan state accessor, registration."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from graph_kvcache_mcp.domain.snapshot_ids import SnapshotIdError
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.state import AppState, Snapshots

READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
WRITES_IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
STARTS_PROCESS = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
# A model call stores nothing of ours, but every call is a new generation (and warms vLLM's prefix
# cache), so a repeat is not a no-op.
CALLS_MODEL = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
STOPS_PROCESS = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)


ServedModel = Annotated[
    str | None, Field(description="Served model; default VLLM_MODEL or the only one.")
]
"""The `model` parameter of every tool that calls vLLM."""


def read_only_refusal(what: str) -> str:
    """What a caller hears when it asks a read-only server for `what` (a tool or an action)."""
    return (
        f"this server is read-only (GRAPH_KVCACHE_READ_ONLY / --read-only): {what} is not available"
    )


@dataclass(frozen=True)
class ToolSpec:
    """One tool as a toolset offers it; `register_all` decides whether it is exposed."""

    fn: Callable[..., Any]
    title: str
    annotations: ToolAnnotations
    read_only_variant: ToolSpec | None = None
    """Served instead, under this tool's name, in read-only mode (e.g. a probe that writes
    nothing); without one a writing tool is simply left out there."""

    @property
    def writes(self) -> bool:
        return not self.annotations.read_only_hint


def register_all(server: Registrar, specs: Sequence[ToolSpec], *, read_only: bool) -> None:
    """Add each spec; read-only mode serves a writer's read-only variant, or leaves it out."""
    for spec in specs:
        served = spec
        if read_only and spec.writes:
            if spec.read_only_variant is None:
                server.withhold(spec.fn.__name__, read_only_refusal(spec.fn.__name__))
                continue
            served = spec.read_only_variant
        server.add_tool(
            served.fn,
            name=spec.fn.__name__,
            title=served.title,
            # The SDK sends __doc__ verbatim; one line so models pay for no indentation.
            description=" ".join((served.fn.__doc__ or "").split()),
            annotations=served.annotations,
        )


T = TypeVar("T")


def snapshot_since(snapshots: Snapshots[T], snapshot_id: str, tool: str) -> T:
    """The snapshot a `since` id carries.

    Raises:
        ToolError: the id is malformed, forged, another data dir's, or of another tool.
    """
    try:
        return snapshots.find(snapshot_id, tool)
    except (SnapshotIdError, ConfigError) as exc:
        raise ToolError(str(exc)) from None


def state_of(ctx: Context[Any]) -> AppState:
    """The lifespan state. Tools annotate `ctx: Context[Any]` so `mcp run/dev` can load them."""
    state = ctx.request_context.lifespan_context
    if not isinstance(state, AppState):  # a server not built by build_server
        raise ToolError("server state missing: start the server with graph-kvcache-mcp")
    return state
