"""The vllm toolset's `tools/list` surface (names, annotations, schemas), pinned by snapshots.

Update after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server

SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_vllm_surface_matches_the_snapshot(read_only: bool, tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm",), read_only=read_only)
    async with Client(build_server(settings)) as client:
        tools = (await client.list_tools()).tools
    dumped = [tool.model_dump(by_alias=True, mode="json", exclude_none=True) for tool in tools]
    text = json.dumps(dumped, indent=2, sort_keys=True) + "\n"
    path = SNAPSHOTS / ("vllm_read_only.json" if read_only else "vllm.json")
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}: run with UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), f"{path.name} changed: review, then UPDATE_SNAPSHOTS=1"
