"""The opt-in lmcache toolset's `tools/list` surface: snapshot and the invariants every tool keeps.

Update after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server

SNAPSHOTS = Path(__file__).parent / "snapshots"


async def tools_of(settings: Settings) -> list[dict[str, Any]]:
    async with Client(build_server(settings)) as client:
        tools = (await client.list_tools()).tools
    return [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools]


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_the_lmcache_surface_matches_its_snapshot(read_only: bool, tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("lmcache",), read_only=read_only)
    text = json.dumps(await tools_of(settings), indent=2, sort_keys=True) + "\n"
    path = SNAPSHOTS / ("lmcache_read_only.json" if read_only else "lmcache.json")
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed: review, then UPDATE_SNAPSHOTS=1"


async def test_every_lmcache_tool_is_described_with_all_four_hints(tmp_path: Path) -> None:
    tools = await tools_of(Settings.build(data_dir=tmp_path, toolsets=("lmcache",)))
    assert {tool["name"] for tool in tools} == {"lmcache_config", "lmcache_check"}
    for tool in tools:
        name = tool["name"]
        assert tool.get("description", "").strip() and tool.get("title"), name
        assert tool.get("outputSchema", {}).get("type") == "object", name
        for hint in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"):
            assert isinstance(tool["annotations"].get(hint), bool), f"{name}: {hint}"
        for prop, schema in tool["inputSchema"].get("properties", {}).items():
            assert schema.get("description"), f"{name}.{prop}: no description"
