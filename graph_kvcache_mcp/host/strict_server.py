"""`StrictServer`: the SDK's `MCPServer` with the argument handling a model can act on.

- Every tool's input schema is lean and closed: no pydantic `title`s and no `null` branch for an
  argument that defaults to null (they cost every conversation bytes and tell the model nothing
  the name and `required` do not), and `additionalProperties: false`: an unknown argument is
  refused by name, never silently dropped.
- Arguments are checked strictly against the published schema, as the JSON they arrived as: a
  wrong JSON type (`true` or `"5"` for an integer, `"yes"` or `"false"` for a boolean) is
  refused by name, never coerced. (The SDK's one leniency stays: an array or object argument
  sent as a JSON-encoded string, which some hosts do, is decoded first.)
- Invalid arguments are described by `errors.describe_validation` (argument, what is wrong,
  what is accepted), not pydantic's report with its documentation links.
- An unknown tool or prompt, or a prompt argument that is unknown or missing, is a JSON-RPC
  `-32602` error (2025-11-25 spec), not a tool result or a logged traceback; a tool withheld by
  read-only mode says that this server is read-only.
- A tool error quotes at most `errors.QUOTE_LIMIT` characters of any argument (with its length):
  a 10 MB argument is never echoed back whole, whichever tool's message named it.
- Protocol errors say what to do (`protocol_errors`): a request before `initialize` is -32600
  "initialize first", a second `initialize` on a session is refused, and params that do not fit
  the method are -32602 naming the field (the SDK answers "Invalid request parameters" alone).
- A result's text block is its structured content as compact JSON (the SDK indents it, which
  costs a model ~25% more tokens for the same facts); its output schema is lean too
  (`tool_schemas.lean_output_schema`), which halves a client's check of every result.
- Over stdio, a line that is not one JSON-RPC message is answered at once (`stdio_guard`); the
  SDK alone drops it, and the client waits for its timeout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import pydantic_core
from mcp import MCPError
from mcp.server import InitializationOptions, NotificationOptions
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.stdio import stdio_server
from mcp.types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    CallToolResult,
    GetPromptResult,
    Icon,
    InputRequiredResult,
    Prompt,
    TextContent,
    ToolAnnotations,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from graph_kvcache_mcp.errors import QUOTE_LIMIT, describe_validation, quoted, shortened
from graph_kvcache_mcp.host.stdio_guard import answering_malformed
from graph_kvcache_mcp.host.tool_schemas import lean_output_schema, lean_schema

LifespanT = TypeVar("LifespanT")
ModelT = TypeVar("ModelT", bound=BaseModel)


def tighten(tool: Tool) -> None:
    """Make `tool` refuse unknown arguments and wrong JSON types, and publish a title-free,
    closed input schema."""
    loose = tool.fn_metadata.arg_model
    config = ConfigDict(**{**loose.model_config, "extra": "forbid"})
    namespace = {"model_config": config, "model_validate": classmethod(_validate_as_json)}
    strict: type[BaseModel] = type(loose.__name__, (loose,), namespace)
    tool.fn_metadata.arg_model = strict  # type: ignore[assignment]
    # The SDK's schema of the same fields, closed: cheaper than generating it again at start-up.
    tool.parameters = lean_schema({**tool.parameters, "additionalProperties": False})
    # The output schema every result is checked against, client side: cheaper to walk lean.
    # (Tool.output_schema is a cached copy of fn_metadata's, read first by tools/list.)
    if tool.fn_metadata.output_schema is not None:
        tool.fn_metadata.output_schema = lean_output_schema(tool.fn_metadata.output_schema)
        tool.__dict__.pop("output_schema", None)


def _validate_as_json(cls: type[ModelT], obj: Any, /, **options: Any) -> ModelT:
    # The SDK validates arguments in Python mode, which is lax ("5" -> 5, "yes" -> True) and, made
    # strict, refuses what JSON cannot carry (tuples, datetimes). Strict JSON mode is the schema.
    # The SDK passes no options here; any given are honoured except `strict`.
    options.pop("strict", None)
    options.pop("from_attributes", None)
    return cls.model_validate_json(json.dumps(obj), strict=True, **options)


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
        self.middleware.insert(0, protocol_errors)
        self._declare_tools_list_changed()

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

    def _declare_tools_list_changed(self) -> None:
        # The `toolsets` tool adds tools at run time, so initialize declares tools.listChanged.
        # SDK 2.3 takes that flag only as an argument of create_initialization_options, which
        # every transport calls without one (tests/unit/test_sdk_seams.py checks this seam);
        # the 2026-07-28 era derives it from subscriptions/listen being served.
        lowlevel = self._lowlevel_server
        plain = lowlevel.create_initialization_options

        def with_list_changed(
            notification_options: NotificationOptions | None = None, **options: Any
        ) -> InitializationOptions:
            flags = notification_options or NotificationOptions(tools_changed=True)
            return plain(flags, **options)

        lowlevel.create_initialization_options = with_list_changed  # type: ignore[method-assign,assignment]

    def bind_live(self, state: LifespanT) -> None:
        self._live.append(state)

    def unbind_live(self, state: LifespanT) -> None:
        self._live[:] = [live for live in self._live if live is not state]

    def tool_names(self) -> list[str]:
        return [tool.name for tool in self._tool_manager.list_tools()]

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
            unknown = f"unknown tool {quoted(name)}; this server has: {known}"
            why = self._withheld.get(name) or unknown
            raise MCPError(code=INVALID_PARAMS, message=why, data={"name": shortened(name)})
        try:
            result = await super().call_tool(name, arguments, context)
            return compact(result) if not tool.fn_metadata.wrap_output else result
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError):
                raise
            if not isinstance(cause, ValidationError):
                message = str(exc)
                clipped = clip_arguments(message, arguments)
                if clipped == message:
                    raise
                raise ToolError(clipped) from cause
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
                message=f"unknown prompt {quoted(name)}; this server has: "
                f"{', '.join(sorted(prompts)) or 'none'}",
                data={"name": shortened(name)},
            )
        check_prompt_arguments(prompts[name], arguments or {})
        return await super().get_prompt(name, arguments, context)

    async def run_stdio_async(self) -> None:
        """Serve over stdio like the SDK, but answer every line it cannot read (see module)."""
        server = self._lowlevel_server
        async with (
            stdio_server() as (read_stream, write_stream),
            answering_malformed(read_stream, write_stream) as checked,
        ):
            await server.run(checked, write_stream, server.create_initialization_options())

    def _tool(self, name: str) -> Tool | None:
        # SDK 2.3 offers no public lookup of a registered Tool (nor a hook for its argument
        # model); tests/unit/host/test_strict_server.py fails if this private seam moves.
        return self._tool_manager.get_tool(name)


def compact(result: CallToolResult | InputRequiredResult) -> CallToolResult | InputRequiredResult:
    """`result` with its one text block written as compact JSON of its structured content."""
    if not isinstance(result, CallToolResult) or result.structured_content is None:
        return result
    if len(result.content) != 1 or not isinstance(result.content[0], TextContent):
        return result
    text = pydantic_core.to_json(result.structured_content).decode()  # compact, ~3x json.dumps
    return result.model_copy(update={"content": [TextContent(type="text", text=text)]})


_SDK_VAGUE_PARAMS = "Invalid request parameters"
_EXEMPT_BEFORE_INIT = frozenset({"initialize", "ping"})


async def protocol_errors(
    ctx: ServerRequestContext[Any, Any], call_next: CallNext
) -> HandlerResult:
    """Middleware: the SDK's protocol errors with a message that says what to do (see module)."""
    if ctx.request_id is None:  # notifications get no answer
        return await call_next(ctx)
    legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
    initialized = ctx.session.client_params is not None
    if ctx.method == "initialize" and legacy and initialized:
        raise MCPError(
            code=INVALID_REQUEST,
            message="this session is already initialized: send initialize once per session "
            "(to start over, open a new session)",
        )
    try:
        return await call_next(ctx)
    except ValidationError as exc:
        problems = describe_validation(exc, whole="params")
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"invalid params for {shortened(ctx.method)}: {problems}",
            data={"method": shortened(ctx.method)},
        ) from None
    except MCPError as exc:
        vague = exc.error.code == INVALID_PARAMS and exc.error.message == _SDK_VAGUE_PARAMS
        if vague and legacy and not initialized and ctx.method not in _EXEMPT_BEFORE_INIT:
            raise MCPError(
                code=INVALID_REQUEST,
                message=f"initialize first: send an initialize request, then the "
                f"notifications/initialized notification, before {shortened(ctx.method)}",
                data={"method": shortened(ctx.method)},
            ) from None
        raise


MESSAGE_LIMIT = 2000
"""The longest tool error sent whole; a longer one (an argument quoted in another form) is cut."""


def clip_arguments(message: str, arguments: object) -> str:
    """`message` with every long string argument it quotes (as given or as its repr) replaced by
    `quoted(value)`: at most `QUOTE_LIMIT` characters of it, and its length."""
    for value in sorted(_long_strings(arguments), key=len, reverse=True):
        for form in (repr(value), value):
            if form in message:
                message = message.replace(form, quoted(value))
    if len(message) > MESSAGE_LIMIT:
        message = f"{message[: MESSAGE_LIMIT - 40]}... (error cut; {len(message)} characters)"
    return message


def _long_strings(value: object) -> set[str]:
    if isinstance(value, str):
        return {value} if len(value) > QUOTE_LIMIT else set()
    if isinstance(value, dict):
        return {text for item in value.values() for text in _long_strings(item)}
    if isinstance(value, list | tuple):
        return {text for item in value for text in _long_strings(item)}
    return set()
