"""`StrictServer`: the SDK's `MCPServer` with the argument handling a model can act on.

- Every tool's input schema is lean and closed: no pydantic `title`s and no `null` branch for an
  argument that defaults to null (they cost every conversation bytes and tell the model nothing
  the name and `required` do not), and `additionalProperties: false`: an unknown argument is
  refused by name, never silently dropped.
- Invalid arguments are described by `errors.describe_validation` (argument, what is wrong,
  what is accepted), not pydantic's report with its documentation links.
- An unknown tool or prompt, or a prompt argument that is unknown or missing, is a JSON-RPC
  `-32602` error (2025-11-25 spec), not a tool result or a logged traceback; a tool withheld by
  read-only mode says that this server is read-only.
"""

from __future__ import annotations

from collections import Counter
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
    Prompt,
    ToolAnnotations,
)
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from graph_kvcache_mcp.errors import describe_validation

LifespanT = TypeVar("LifespanT")

# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
_ONE_SCHEMA = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")
_NULL = {"type": "null"}
_DEFS = "#/$defs/"


def lean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as a model needs it: every `title` keyword dropped (a property *named* title
    stays), no class docstrings on `$defs`, an optional value whose default is null shown as its
    plain type (omitting it means null; a null sent anyway is still accepted), and a definition
    used once written in place (hosts resolve inline schemas most reliably)."""
    return _inline_single_use_defs(_lean(schema))


def _lean(schema: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in schema.items() if key != "title"}
    if "$defs" in out:
        # A definition's description is its class docstring: written for code readers, and the
        # properties that use it carry their own descriptions.
        out["$defs"] = {
            name: {k: v for k, v in sub.items() if k != "description"}
            for name, sub in out["$defs"].items()
        }
    if "default" in out and out["default"] is None and _is_nullable(out.get("anyOf")):
        (kept,) = [sub for sub in out.pop("anyOf") if sub != _NULL]
        del out["default"]
        out = {**kept, **out}
    for key in _ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = _lean(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_lean(sub) for sub in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _lean(sub) for name, sub in out[key].items()}
    return out


def _inline_single_use_defs(schema: dict[str, Any]) -> dict[str, Any]:
    defs: dict[str, Any] = schema.get("$defs") or {}
    uses = Counter(_refs(schema))
    once = {name for name in defs if uses[f"{_DEFS}{name}"] == 1}

    def resolve(node: Any, inside: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [resolve(sub, inside) for sub in node]
        if not isinstance(node, dict):
            return node
        name = str(node.get("$ref", "")).removeprefix(_DEFS)
        if name in once and name not in inside:  # `inside` stops a definition that nests itself
            rest = {key: resolve(value, inside) for key, value in node.items() if key != "$ref"}
            return {**resolve(defs[name], inside | {name}), **rest}
        return {key: resolve(value, inside) for key, value in node.items()}

    out = resolve({key: value for key, value in schema.items() if key != "$defs"}, frozenset())
    kept = {name: resolve(sub, frozenset({name})) for name, sub in defs.items() if name not in once}
    return {**out, "$defs": kept} if kept else out


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [ref for sub in node for ref in _refs(sub)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return own + [ref for value in node.values() for ref in _refs(value)]


def _is_nullable(options: object) -> bool:
    return isinstance(options, list) and len(options) == 2 and _NULL in options


def tighten(tool: Tool) -> None:
    """Make `tool` refuse unknown arguments and publish a title-free, closed input schema."""
    loose = tool.fn_metadata.arg_model
    config = ConfigDict(**{**loose.model_config, "extra": "forbid"})
    strict: type[BaseModel] = type(loose.__name__, (loose,), {"model_config": config})
    tool.fn_metadata.arg_model = strict  # type: ignore[assignment]
    # The SDK's schema of the same fields, closed: cheaper than generating it again at start-up.
    tool.parameters = lean_schema({**tool.parameters, "additionalProperties": False})


def argument_names(tool: Tool) -> list[str]:
    return [field.alias or name for name, field in tool.fn_metadata.arg_model.model_fields.items()]


def check_prompt_arguments(prompt: Prompt, arguments: dict[str, Any]) -> None:
    """Refuse unknown or missing prompt arguments as JSON-RPC -32602 naming them (the SDK would
    answer code 0 and log a traceback). Prompt arguments are strings (MCP spec).

    Raises:
        MCPError: INVALID_PARAMS, with `describe_validation`'s text.
    """
    declared = prompt.arguments or []
    fields: dict[str, Any] = {arg.name: (str, ... if arg.required else None) for arg in declared}
    closed = ConfigDict(extra="forbid")
    model = create_model(f"{prompt.name}_arguments", __config__=closed, **fields)
    try:
        model.model_validate(arguments)
    except ValidationError as exc:
        problems = describe_validation(
            exc, whole="arguments", accepted=list(fields), noun="argument"
        )
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"invalid arguments for prompt {prompt.name}: {problems}",
            data={"name": prompt.name},
        ) from None


class StrictServer(MCPServer[LifespanT]):
    """`MCPServer` whose tools have strict schemas and whose errors name the fix (see module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._withheld: dict[str, str] = {}
        # Static resources get no Context in SDK 2.3, so they find the running lifespan's state
        # here. A stack: each in-memory Client runs its own lifespan on the same server object.
        self._live: list[LifespanT] = []

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

    def bind_live(self, state: LifespanT) -> None:
        self._live.append(state)

    def unbind_live(self, state: LifespanT) -> None:
        self._live[:] = [live for live in self._live if live is not state]

    def live_state(self) -> LifespanT | None:
        """The state of the most recent running lifespan, None when none runs."""
        return self._live[-1] if self._live else None

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
        prompts = {prompt.name: prompt for prompt in await self.list_prompts()}
        if name not in prompts:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"unknown prompt {name!r}; this server has: "
                f"{', '.join(sorted(prompts)) or 'none'}",
                data={"name": name},
            )
        check_prompt_arguments(prompts[name], arguments or {})
        return await super().get_prompt(name, arguments, context)

    def _tool(self, name: str) -> Tool | None:
        # SDK 2.3 offers no public lookup of a registered Tool (nor a hook for its argument
        # model); tests/unit/test_strict_server.py fails if this private seam moves.
        return self._tool_manager.get_tool(name)
