"""`StrictServer`: the SDK's `MCPServer` with the argument handling a model can act on.

- Every tool's input schema is tight: no pydantic `title`s (they cost every conversation bytes
  and tell the model nothing the property name does not) and `additionalProperties: false`; an
  unknown argument is refused by name, never silently dropped.
- Invalid arguments are described by `errors.describe_validation` (argument, what is wrong,
  what is accepted), not pydantic's report with its documentation links.
- An unknown tool or prompt is a JSON-RPC `-32602` error (2025-11-25 spec), not a tool result or
  a logged traceback; a tool withheld by read-only mode says that this server is read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from mcp import MCPError
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import (
    INVALID_PARAMS,
    CallToolResult,
    GetPromptResult,
    Icon,
    InputRequiredResult,
    ToolAnnotations,
)
from pydantic import BaseModel, ConfigDict, ValidationError

from graph_kvcache_mcp.errors import describe_validation

LifespanT = TypeVar("LifespanT")

# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
_ONE_SCHEMA = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")


def without_titles(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every `title` keyword removed (a property *named* title stays)."""
    out = {key: value for key, value in schema.items() if key != "title"}
    for key in _ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = without_titles(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [without_titles(sub) for sub in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: without_titles(sub) for name, sub in out[key].items()}
    return out


def tighten(tool: Tool) -> None:
    """Make `tool` refuse unknown arguments and publish a title-free, closed input schema."""
    loose = tool.fn_metadata.arg_model
    config = ConfigDict(**{**loose.model_config, "extra": "forbid"})
    strict: type[BaseModel] = type(loose.__name__, (loose,), {"model_config": config})
    tool.fn_metadata.arg_model = strict  # type: ignore[assignment]
    tool.parameters = without_titles(strict.model_json_schema(by_alias=True))


def argument_names(tool: Tool) -> list[str]:
    return [field.alias or name for name, field in tool.fn_metadata.arg_model.model_fields.items()]


class StrictServer(MCPServer[LifespanT]):
    """`MCPServer` whose tools have strict schemas and whose errors name the fix (see module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._withheld: dict[str, str] = {}

    def add_tool(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        icons: list[Icon] | None = None,
        meta: dict[str, Any] | None = None,
        structured_output: bool | None = None,
    ) -> None:
        super().add_tool(
            fn,
            name=name,
            title=title,
            description=description,
            annotations=annotations,
            icons=icons,
            meta=meta,
            structured_output=structured_output,
        )
        tool = self._tool(name or fn.__name__)
        assert tool is not None
        tighten(tool)

    def withhold(self, name: str, reason: str) -> None:
        """Note a tool this server leaves out, so calling it says why instead of 'unknown'."""
        self._withheld[name] = reason

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[LifespanT, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self._tool(name)
        if tool is None:
            known = ", ".join(sorted(t.name for t in await self.list_tools()))
            why = self._withheld.get(name) or f"unknown tool {name!r}; this server has: {known}"
            raise MCPError(code=INVALID_PARAMS, message=why, data={"name": name})
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            problems = describe_validation(
                cause, whole="arguments", accepted=argument_names(tool), noun="argument"
            )
            raise ToolError(
                f"Error executing tool {name}: invalid arguments: {problems}. "
                f"Fix them and call {name} again."
            ) from cause

    async def get_prompt(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        context: Context[LifespanT, Any] | None = None,
    ) -> GetPromptResult | InputRequiredResult:
        prompts = sorted(prompt.name for prompt in await self.list_prompts())
        if name not in prompts:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"unknown prompt {name!r}; this server has: {', '.join(prompts) or 'none'}",
                data={"name": name},
            )
        return await super().get_prompt(name, arguments, context)

    def _tool(self, name: str) -> Tool | None:
        # SDK 2.3 offers no public lookup of a registered Tool (nor a hook for its argument
        # model); tests/unit/test_strict_server.py fails if this private seam moves.
        return self._tool_manager.get_tool(name)
