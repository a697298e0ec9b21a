"""Every host configuration in examples/ works as written: filled in as examples/README.md says,
then launched the way its host would (command, arguments and environment from the file) and
asked for its tools over stdio, or over HTTP with the bearer token for the Inspector's HTTP file.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ListRootsResult

from graph_kvcache_mcp.config import DEFAULT_TOOLSETS
from graph_kvcache_mcp.connectors.processes.ports import free_port, port_in_use
from tests.support.processes import REPO, clean_env, venv_script, wait_until

EXAMPLES = REPO / "examples"
PATH_PLACEHOLDER = "/ABSOLUTE/PATH/TO/.venv"
TOKEN_PLACEHOLDER = "PASTE-GRAPH_KVCACHE_HTTP_TOKEN-HERE"
STDIO_EXAMPLES = [
    "claude-code/.mcp.json",
    "opencode/opencode.json",
    "claude-desktop/claude_desktop_config.json",
    "inspector/stdio.json",
    "mcp-servers.json",
]
HOST_FILES = [*STDIO_EXAMPLES, "inspector/http.json"]


def _filled(relative: str, **extra: str) -> dict[str, Any]:
    """The example as a user has it after the README's `sed`: the real venv path filled in."""
    text = (EXAMPLES / relative).read_text()
    text = text.replace(PATH_PLACEHOLDER, str(venv_script("python").parent.parent))
    for placeholder, value in extra.items():
        text = text.replace(placeholder, value)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _launch(relative: str, config: dict[str, Any]) -> tuple[str, list[str], dict[str, str]]:
    """(command, args, env) as the host of `relative` reads them from its own syntax."""
    if relative.startswith("opencode/"):
        (entry,) = config["mcp"].values()
        assert entry["type"] == "local" and entry["enabled"] is True
        program, *args = entry["command"]
        launch = (program, args, entry.get("environment", {}))
    else:
        (entry,) = config["mcpServers"].values()
        assert entry.get("type", "stdio") == "stdio"
        launch = (entry["command"], entry.get("args", []), entry.get("env", {}))
    assert Path(launch[0]).is_absolute() and Path(launch[0]).exists()  # no PATH lookup
    return launch


MODELS = REPO / "tests" / "data" / "models"
MODEL_CONFIG = MODELS / "llama-3.1-8b.config.json"


async def _no_roots(context: ClientRequestContext) -> ListRootsResult:
    return ListRootsResult(roots=[])


@pytest.mark.parametrize("relative", HOST_FILES)
def test_no_example_relies_on_a_hosts_own_variable_expansion(relative: str) -> None:
    text = (EXAMPLES / relative).read_text()
    assert "${" not in text and "$(" not in text
    json.loads(text)  # plain JSON: no comments, no trailing commas


@pytest.mark.parametrize("relative", STDIO_EXAMPLES)
async def test_each_stdio_example_starts_the_server_and_lists_its_tools(
    relative: str, tmp_path: Path
) -> None:
    command, args, env = _launch(relative, _filled(relative))
    # The host's own environment, with its user data dir pointed at a scratch dir.
    server = StdioServerParameters(
        command=command,
        args=args,
        env={"XDG_DATA_HOME": str(tmp_path), **env},
        cwd=str(MODELS),  # hosts start servers in their own directory
    )
    # Like the MCP Inspector: declares the roots capability, lists none.
    async with Client(server, mode="legacy", list_roots_callback=_no_roots) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        budget = await client.call_tool("diagnose_budget", {"hf_config": str(MODEL_CONFIG)})
    toolsets = env.get("GRAPH_KVCACHE_TOOLSETS", ",".join(DEFAULT_TOOLSETS)).split(",")
    assert set(DEFAULT_TOOLSETS) <= set(toolsets)  # an example never drops a default toolset
    assert {"kv_stats", "kv_get", "toolsets", "engine_status", "diagnose_stack"} <= names
    assert not budget.is_error, budget.content  # a path tool works with an empty roots list
    assert ("vllm_chat" in names, "bundle_render" in names) == (
        "vllm" in toolsets,
        "bundle" in toolsets,
    )
    assert ("lmcache_config" in names) == ("lmcache" in toolsets)
    assert ("kv_put" in names) == ("--read-only" not in args)
    assert {"VLLM_BASE_URL", "VLLM_API_KEY", "VLLM_MODEL"} <= set(env)


def test_the_inspector_http_example_lists_the_tools_with_the_token(tmp_path: Path) -> None:
    port, token = free_port(), "examples-http-token-0123456789abcdef"
    config = _filled("inspector/http.json", **{TOKEN_PLACEHOLDER: token})
    (entry,) = config["mcpServers"].values()
    assert entry["type"] == "streamable-http"
    url = entry["url"].replace(":8765/", f":{port}/")  # the README's port may be taken here
    command = [str(venv_script("graph-kvcache-mcp")), "serve", "--transport", "http"]
    server = subprocess.Popen(
        [*command, "--port", str(port)],  # as examples/README.md starts it
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=clean_env(GRAPH_KVCACHE_HTTP_TOKEN=token, GRAPH_KVCACHE_DATA_DIR=str(tmp_path)),
    )
    try:
        wait_until(lambda: port_in_use("127.0.0.1", port), timeout_s=60, what="the HTTP port")
        names = anyio.run(_tools_over_http, url, entry["headers"])
    finally:
        server.terminate()
        _, err = server.communicate(timeout=20)
    assert {"kv_stats", "kv_probe", "vllm_chat", "bundle_compile"} <= names
    assert token not in err.decode()


async def _tools_over_http(url: str, headers: dict[str, str]) -> set[str]:
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        return {tool.name for tool in (await client.list_tools()).tools}
