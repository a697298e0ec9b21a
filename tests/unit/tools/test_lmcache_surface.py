"""The opt-in lmcache toolset's `tools/list` surface: snapshot and the invariants every tool keeps.

Update after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from tests.support.surfaces import assert_matches_snapshot, assert_well_described, tools_of

SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_the_lmcache_surface_matches_its_snapshot(read_only: bool, tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("lmcache",), read_only=read_only)
    path = SNAPSHOTS / ("lmcache_read_only.json" if read_only else "lmcache.json")
    assert_matches_snapshot(path, await tools_of(settings))


async def test_every_lmcache_tool_is_described_with_all_four_hints(tmp_path: Path) -> None:
    tools = await tools_of(Settings.build(data_dir=tmp_path, toolsets=("lmcache",)))
    assert {tool["name"] for tool in tools} == {
        "lmcache_config",
        "lmcache_check",
        "lmcache_start",
        "lmcache_stop",
        "lmcache_status",
    }
    for tool in tools:
        assert_well_described(tool)
