"""docs/mcp-server.md lists exactly the tools of every toolset, with the right toolset and read-only
columns, checked against the real tool list."""

from __future__ import annotations

import re
from pathlib import Path

from mcp import Client

from graph_kvcache_mcp.config import TOOLSETS, Settings
from graph_kvcache_mcp.server import build_server

DOC = Path(__file__).resolve().parents[3] / "docs" / "mcp-server.md"
ROW = re.compile(r"^\| `(?P<name>[a-z_]+)` \| (?P<toolset>\w+) \| (?P<read_only>[^|]+) \|", re.M)


async def _names(settings: Settings) -> set[str]:
    async with Client(build_server(settings)) as client:
        return {tool.name for tool in (await client.list_tools()).tools}


async def test_the_tool_table_matches_the_registered_tools(tmp_path: Path) -> None:
    rows = {m["name"]: m for m in ROW.finditer(DOC.read_text())}
    full = Settings.build(data_dir=tmp_path, toolsets=TOOLSETS)
    read_only = full.model_copy(update={"read_only": True})
    assert set(rows) == await _names(full)
    in_read_only = {name for name, row in rows.items() if row["read_only"].startswith("yes")}
    assert in_read_only == await _names(read_only)
    for toolset in TOOLSETS:
        one = full.model_copy(update={"toolsets": (toolset,)})
        listed = {name for name, row in rows.items() if row["toolset"] == toolset}
        assert listed == await _names(one), toolset
