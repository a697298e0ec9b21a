"""The opt-in cache toolset's `tools/list` surface: snapshot, hints, size, and none of it in
read-only mode.

Update after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
"""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.config import Settings
from tests.support.surfaces import (
    assert_matches_snapshot,
    assert_well_described,
    model_view_bytes,
    tools_of,
)

SNAPSHOTS = Path(__file__).parent / "snapshots"
CACHE_BUDGET_BYTES = 3_000
"""What the opt-in cache toolset adds to a model's tool list (name, description, input schema)."""


async def test_the_cache_surface_matches_its_snapshot_and_marks_the_destructive_tools(
    tmp_path: Path,
) -> None:
    tools = await tools_of(Settings.build(data_dir=tmp_path, toolsets=("cache",)))
    assert_matches_snapshot(SNAPSHOTS / "cache.json", tools)
    hints = {tool["name"]: tool["annotations"]["destructiveHint"] for tool in tools}
    assert hints == {
        "cache_warm": False,
        "cache_evict": True,
        "cache_pin": False,
        "cache_unpin": True,
    }
    for tool in tools:
        assert_well_described(tool)
        assert tool["annotations"]["readOnlyHint"] is False
    assert model_view_bytes(tools) <= CACHE_BUDGET_BYTES


async def test_a_read_only_server_offers_no_cache_tool(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("cache",), read_only=True)
    assert await tools_of(settings) == []
