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

from graph_kvcache_mcp.strict_server import StrictServer

PINNED_MINOR = "2.3."


def echo(text: str, times: int = 1) -> str:
    """Repeat `text`."""
    return text * times


def test_the_installed_sdk_is_the_minor_version_the_seams_were_read_from() -> None:
    assert version("mcp").startswith(PINNED_MINOR), (
        f"mcp {version('mcp')} is installed; StrictServer was written against {PINNED_MINOR}x: "
        "re-read its private seams (_tool_manager.get_tool, Tool.fn_metadata.arg_model, "
        "Tool.parameters) and update the pin and this test"
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
