"""`tools/list` snapshots (names, annotations, schemas) and invariants every tool must keep.

Update the snapshots after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server
from tests.support.surfaces import (
    assert_matches_snapshot,
    assert_well_described,
    model_view_bytes,
    tools_of,
)

SNAPSHOTS = Path(__file__).parent / "snapshots"
TOOL_LIST_BUDGET_BYTES = 20_000
"""What the default tool list may cost every conversation (name, description, inputSchema as
compact JSON): about 5k tokens. Details belong in docs/, not in descriptions."""


async def _surface(settings: Settings) -> dict[str, Any]:
    async with Client(build_server(settings)) as client:
        tools = (await client.list_tools()).tools
        resources = (await client.list_resources()).resources
        prompts = (await client.list_prompts()).prompts
    dump = {"by_alias": True, "mode": "json", "exclude_none": True}
    return {
        "tools": [tool.model_dump(**dump) for tool in tools],  # type: ignore[arg-type]
        "resources": [r.model_dump(**dump) for r in resources],  # type: ignore[arg-type]
        "prompts": [p.model_dump(**dump) for p in prompts],  # type: ignore[arg-type]
    }


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_kv_compat_and_engine_surface_matches_the_snapshot(
    read_only: bool, tmp_path: Path
) -> None:
    settings = Settings.build(
        data_dir=tmp_path, toolsets=("kv", "compat", "engine"), read_only=read_only
    )
    name = "kv_engine_read_only" if read_only else "kv_engine"
    assert_matches_snapshot(SNAPSHOTS / f"{name}.json", await _surface(settings))


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_every_tool_has_a_description_an_output_schema_and_all_four_hints(
    read_only: bool, tmp_path: Path
) -> None:
    settings = Settings.build(data_dir=tmp_path, read_only=read_only)
    tools = (await _surface(settings))["tools"]
    assert tools
    for tool in tools:
        assert_well_described(tool)


async def test_read_only_drops_exactly_the_tools_that_are_not_read_only(tmp_path: Path) -> None:
    full = (await _surface(Settings.build(data_dir=tmp_path)))["tools"]
    read_only = (await _surface(Settings.build(data_dir=tmp_path, read_only=True)))["tools"]
    readers = {t["name"] for t in full if t["annotations"]["readOnlyHint"]}
    assert {t["name"] for t in read_only} >= readers
    assert all(t["annotations"]["readOnlyHint"] for t in read_only)


async def test_toolsets_register_only_the_named_groups(tmp_path: Path) -> None:
    surface = await _surface(Settings.build(data_dir=tmp_path, toolsets=("engine",)))
    assert {t["name"] for t in surface["tools"]} == {"engine_status", "engine_start", "engine_stop"}
    assert surface["resources"] == [] and surface["prompts"] == []


async def test_the_default_tool_list_costs_a_model_at_most_its_budget(tmp_path: Path) -> None:
    tools = await tools_of(Settings.build(data_dir=tmp_path))
    assert model_view_bytes(tools) <= TOOL_LIST_BUDGET_BYTES
