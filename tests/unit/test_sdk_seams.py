"""The MCP SDK's private seams `StrictServer` relies on, checked so an SDK upgrade fails here,
loudly and by name, instead of quietly loosening every tool's argument checks.

pyproject pins `mcp` to the minor version these seams were read from; raising the pin means
reading them again and updating this file.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, ValidationError

from graph_kvcache_mcp.host.strict_server import StrictServer

PINNED_MINOR = "2.3."


def echo(text: str, times: int = 1) -> str:
    """Repeat `text`."""
    return text * times


def test_the_installed_sdk_is_the_minor_version_the_seams_were_read_from() -> None:
    assert version("mcp").startswith(PINNED_MINOR), (
        f"mcp {version('mcp')} is installed; StrictServer was written against {PINNED_MINOR}x: "
        "re-read its private seams (_tool_manager.get_tool, Tool.fn_metadata.arg_model, "
        "Tool.parameters, Tool.fn_metadata.output_schema, "
        "_lowlevel_server.create_initialization_options) and update the pin and this test"
    )


def test_the_tool_registry_and_argument_model_are_where_strict_server_reaches_them() -> None:
    plain: MCPServer[None] = MCPServer("seams")
    plain.add_tool(echo)
    tool = plain._tool_manager.get_tool("echo")
    assert tool is not None, "MCPServer._tool_manager.get_tool no longer finds registered tools"
    arg_model = tool.fn_metadata.arg_model
    assert isinstance(arg_model, type) and issubclass(arg_model, BaseModel)
    assert set(arg_model.model_fields) == {"text", "times"}
    assert isinstance(tool.parameters, dict) and tool.parameters["properties"].keys() == {
        "text",
        "times",
    }


def test_strict_server_really_closes_the_argument_model_through_those_seams() -> None:
    strict: StrictServer[None] = StrictServer("seams")
    strict.add_tool(echo)
    tool = strict._tool_manager.get_tool("echo")
    assert tool is not None
    assert tool.parameters["additionalProperties"] is False
    with pytest.raises(ValidationError, match="extra"):
        tool.fn_metadata.arg_model.model_validate({"text": "a", "colour": "red"})


def test_initialization_options_declare_tools_list_changed_through_the_lowlevel_seam() -> None:
    strict: StrictServer[None] = StrictServer("seams")
    options = strict._lowlevel_server.create_initialization_options()
    assert options.capabilities.tools is not None
    assert options.capabilities.tools.list_changed is True
    plain: MCPServer[None] = MCPServer("seams")
    tools = plain._lowlevel_server.create_initialization_options().capabilities.tools
    assert tools is not None and not tools.list_changed  # the SDK alone says false


class Shaped(BaseModel):
    note: str | None = None


def shaped() -> Shaped:
    """Return a model."""
    return Shaped()


def test_the_published_output_schema_is_fn_metadatas_read_through_tool_output_schema() -> None:
    strict: StrictServer[None] = StrictServer("seams")
    strict.add_tool(shaped)
    tool = strict._tool_manager.get_tool("shaped")
    assert tool is not None and tool.output_schema is tool.fn_metadata.output_schema
    assert tool.output_schema is not None
    assert tool.output_schema["properties"]["note"]["type"] == ["string", "null"]
