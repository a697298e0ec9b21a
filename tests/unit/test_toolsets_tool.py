"""The `toolsets` tool in both protocol eras, in memory: enabling adds the toolset's tools (in
read-only mode only its read-only ones), and nothing else changes."""

from __future__ import annotations

from pathlib import Path

import anyio
from mcp import Client
from mcp.shared.subscriptions import ToolsListChanged

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.tools.toolsets import ToolsetsOut
from tests.support.mcp_calls import MODES, call_ok


async def _names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


@MODES
async def test_enabling_lmcache_lists_its_tools_without_touching_the_others(
    mode: str, tmp_path: Path
) -> None:
    async with Client(build_server(Settings.build(data_dir=tmp_path)), mode=mode) as client:
        before = await _names(client)
        out = ToolsetsOut.model_validate(await call_ok(client, "toolsets", {"enable": "lmcache"}))
        after = await _names(client)
    assert out.tools_added and set(out.tools_added) == after - before
    assert all(name.startswith("lmcache_") for name in out.tools_added)
    assert before <= after
    assert out.instructions and "lmcache_config" in out.instructions
    assert [line.name for line in out.toolsets if line.enabled and line.name == "lmcache"]


async def test_read_only_mode_enables_only_the_read_only_tools(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, read_only=True)
    async with Client(build_server(settings)) as client:
        out = ToolsetsOut.model_validate(await call_ok(client, "toolsets", {"enable": "lmcache"}))
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert out.tools_added and "lmcache_start" not in tools and "lmcache_stop" not in tools
    for name in out.tools_added:
        annotations = tools[name].annotations
        assert annotations is not None and annotations.read_only_hint is True


async def test_a_server_without_the_toolsets_toolset_offers_no_switch(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("kv",))
    async with Client(build_server(settings)) as client:
        assert "toolsets" not in await _names(client)


async def test_a_2026_client_listening_for_tool_changes_gets_the_event(tmp_path: Path) -> None:
    async with Client(build_server(Settings.build(data_dir=tmp_path)), mode="auto") as client:
        async with client.listen(tools_list_changed=True) as changes:
            await call_ok(client, "toolsets", {"enable": "fleet"})
            with anyio.fail_after(10):
                event = await changes.__anext__()
        names = await _names(client)
    assert isinstance(event, ToolsListChanged)
    assert any(name.startswith("fleet_") for name in names)
