"""The bundle toolset's `tools/list` surface (names, annotations, schemas) as a reviewed snapshot.

Update after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from tests.support.surfaces import assert_matches_snapshot, tools_of

SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_bundle_surface_matches_the_snapshot(read_only: bool, tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("bundle",), read_only=read_only)
    path = SNAPSHOTS / ("bundle_read_only.json" if read_only else "bundle.json")
    assert_matches_snapshot(path, await tools_of(settings))


async def test_read_only_keeps_the_bundle_readers_and_drops_compile(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("bundle",), read_only=True)
    names = {tool["name"] for tool in await tools_of(settings)}
    assert names == {"bundle_render", "bundle_chat", "bundle_reuse_measure"}
