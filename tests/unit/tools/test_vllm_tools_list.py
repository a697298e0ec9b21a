"""The vllm toolset's `tools/list` surface (names, annotations, schemas), pinned by snapshots.

Update after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from tests.support.surfaces import assert_matches_snapshot, tools_of

SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_vllm_surface_matches_the_snapshot(read_only: bool, tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm",), read_only=read_only)
    path = SNAPSHOTS / ("vllm_read_only.json" if read_only else "vllm.json")
    assert_matches_snapshot(path, await tools_of(settings))


async def test_model_calls_are_not_idempotent_and_vllm_start_may_reach_the_hub(
    tmp_path: Path,
) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm", "bundle"))
    hints = {tool["name"]: tool["annotations"] for tool in await tools_of(settings)}
    for name in ("vllm_chat", "bundle_chat", "bundle_reuse_measure"):
        assert hints[name]["idempotentHint"] is False, name
    assert hints["vllm_start"]["openWorldHint"] is True
    assert {name for name, hint in hints.items() if hint["openWorldHint"]} == {"vllm_start"}
