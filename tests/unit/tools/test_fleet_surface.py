"""The opt-in fleet toolset's `tools/list` surface: snapshot, descriptions, and its size.

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
FLEET_BUDGET_BYTES = 2_000
"""What the opt-in fleet toolset adds to a model's tool list (as the default list's budget
counts: name, description, input schema)."""


async def test_the_fleet_surface_matches_its_snapshot_and_stays_small(tmp_path: Path) -> None:
    tools = await tools_of(Settings.build(data_dir=tmp_path, toolsets=("fleet",)))
    assert_matches_snapshot(SNAPSHOTS / "fleet.json", tools)
    assert {tool["name"] for tool in tools} == {
        "fleet_status",
        "fleet_where_cached",
        "fleet_effectiveness",
    }
    for tool in tools:
        assert_well_described(tool)
        assert tool["annotations"]["readOnlyHint"] is True
    assert model_view_bytes(tools) <= FLEET_BUDGET_BYTES
