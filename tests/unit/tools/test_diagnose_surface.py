"""The diagnose toolset's `tools/list` surface: snapshot, invariants, and what it costs a model.

Update after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.config import DEFAULT_TOOLSETS, Settings
from tests.support.surfaces import assert_matches_snapshot, assert_well_described, tools_of

SNAPSHOTS = Path(__file__).parent / "snapshots"
MODEL_VIEW_BUDGET_BYTES = 3_500
"""What the three diagnose tools may cost as a host forwards them (name, description, schema)."""


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_the_diagnose_surface_matches_its_snapshot(read_only: bool, tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("diagnose",), read_only=read_only)
    path = SNAPSHOTS / ("diagnose_read_only.json" if read_only else "diagnose.json")
    assert_matches_snapshot(path, await tools_of(settings))


async def test_every_diagnose_tool_is_described_with_all_four_hints(tmp_path: Path) -> None:
    assert "diagnose" in DEFAULT_TOOLSETS
    tools = await tools_of(Settings.build(data_dir=tmp_path, toolsets=("diagnose",)))
    for tool in tools:
        assert_well_described(tool)


async def test_the_diagnose_tools_cost_a_model_at_most_their_byte_budget(tmp_path: Path) -> None:
    tools = await tools_of(Settings.build(data_dir=tmp_path, toolsets=("diagnose",)))
    seen = [
        {"name": t["name"], "description": t["description"], "inputSchema": t["inputSchema"]}
        for t in tools
    ]
    size = len(json.dumps(seen, separators=(",", ":")).encode())
    assert size <= MODEL_VIEW_BUDGET_BYTES, f"diagnose tools cost {size} bytes"
