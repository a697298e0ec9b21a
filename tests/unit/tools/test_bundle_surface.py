"""The bundle toolset's `tools/list` surface (names, annotations, schemas) as a reviewed snapshot.

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


async def _tools(settings: Settings) -> list[dict[str, Any]]:
    async with Client(build_server(settings)) as client:
        tools = (await client.list_tools()).tools
    return [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools]


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_bundle_surface_matches_the_snapshot(read_only: bool, tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("bundle",), read_only=read_only)
    text = json.dumps(await _tools(settings), indent=2, sort_keys=True) + "\n"
    path = SNAPSHOTS / ("bundle_read_only.json" if read_only else "bundle.json")
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}: run with UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), f"{path.name} changed: review, then UPDATE_SNAPSHOTS=1"


async def test_read_only_keeps_the_bundle_readers_and_drops_compile(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("bundle",), read_only=True)
    names = {tool["name"] for tool in await _tools(settings)}
    assert names == {"bundle_render", "bundle_chat", "bundle_reuse_measure"}
