"""`toolsets`: list this server's toolsets and enable an opt-in one at run time.

The default tool list has a byte budget; lmcache, fleet and compat stay out of it until a client
asks. Enabling registers the toolset on this server (over stdio that is the one session; over
HTTP every session sees it) and tells the client to list tools again: a
`notifications/tools/list_changed` on the session (2025 protocol), or a `subscriptions/listen`
event (2026-07-28).
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations, ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

from graph_kvcache_mcp.host.registrar import Registrar, ToolsetSwitch

# It changes nothing outside this server and adds only tools the server's mode allows; a second
# enable of the same toolset is refused, so it is not idempotent.
SWITCHES_TOOLSET = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)


class ToolsetLine(BaseModel):
    name: str
    enabled: bool
    summary: str


class ToolsetsOut(BaseModel):
    """This server's toolsets; after enable=NAME also what that added."""

    toolsets: list[ToolsetLine]
    enabled_now: str | None = Field(None, description="The toolset this call enabled.")
    tools_added: list[str] = Field(default_factory=list, description="Its tools, now listed.")
    instructions: str | None = Field(None, description="How to use the toolset just enabled.")


def register(server: Registrar, switch: ToolsetSwitch) -> None:
    async def toolsets(
        ctx: Context[Any],
        enable: Annotated[str | None, Field(description="An opt-in toolset to add.")] = None,
    ) -> ToolsetsOut:
        """List the toolsets, one line each; enable=NAME adds an opt-in one's tools and tells
        the client to list tools again."""
        if enable is None:
            return ToolsetsOut(toolsets=_lines(switch))
        try:
            added, instructions = switch.enable(enable)
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        await _announce(ctx)
        return ToolsetsOut(
            toolsets=_lines(switch),
            enabled_now=enable,
            tools_added=added,
            instructions=instructions,
        )

    server.add_tool(
        toolsets,
        name="toolsets",
        title="Toolsets (list, enable)",
        description=" ".join((toolsets.__doc__ or "").split()),
        annotations=SWITCHES_TOOLSET,
    )


def _lines(switch: ToolsetSwitch) -> list[ToolsetLine]:
    return [
        ToolsetLine(name=name, enabled=enabled, summary=summary)
        for name, enabled, summary in switch.catalog()
    ]


async def _announce(ctx: Context[Any]) -> None:
    """Tell the client its tool list changed, the way its protocol era delivers that."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await ctx.notify_tools_changed()  # to its subscriptions/listen stream
        return
    # On the request's own stream: over HTTP it arrives before the result, without the client
    # having to hold a standalone GET stream open.
    await ctx.session.send_notification(
        ToolListChangedNotification(), related_request_id=ctx.request_id
    )
