"""A server's `tools/list` surface as reviewed JSON snapshots, the invariants every tool keeps, and
what the list costs a model.

Update the snapshots after an intended change with `UPDATE_SNAPSHOTS=1 pytest tests/unit/tools`.
Print the cost of the default tool list, per tool: `.venv/bin/python -m tests.support.surfaces`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server


async def tools_of(settings: Settings) -> list[dict[str, Any]]:
    """The tools a server built from `settings` lists, as the JSON a client receives."""
    async with Client(build_server(settings)) as client:
        tools = (await client.list_tools()).tools
    return [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools]


def model_view(tool: dict[str, Any]) -> str:
    """What a host forwards to the model for one tool: name, description and inputSchema as
    compact JSON (titles, annotations and outputSchema stay with the host)."""
    seen = {key: tool.get(key) for key in ("name", "description", "inputSchema")}
    return json.dumps(seen, separators=(",", ":"), ensure_ascii=False)


def model_view_bytes(tools: list[dict[str, Any]]) -> int:
    """The whole tool list's cost to a model, in UTF-8 bytes of `model_view`."""
    return sum(len(model_view(tool).encode()) for tool in tools)


def assert_matches_snapshot(path: Path, surface: Any) -> None:
    """`surface` equals the snapshot at `path` (rewritten first when UPDATE_SNAPSHOTS=1)."""
    text = json.dumps(surface, indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}: run with UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), f"{path.name} changed: review, then UPDATE_SNAPSHOTS=1"


def assert_well_described(tool: dict[str, Any]) -> None:
    """A description, a title, an object output schema, all four hints, every parameter
    described, and a short lower-case snake_case name."""
    name = tool["name"]
    assert tool.get("description", "").strip(), f"{name}: no description"
    assert tool.get("title"), f"{name}: no title"
    assert tool.get("outputSchema", {}).get("type") == "object", f"{name}: no output schema"
    hints = tool.get("annotations", {})
    for hint in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"):
        assert isinstance(hints.get(hint), bool), f"{name}: {hint} not set"
    for where, schema in _properties(tool["inputSchema"], name):
        assert schema.get("description"), f"{where}: no description"
    assert len(name) < 64 and name.replace("_", "").isalnum() and name.islower()


def _properties(schema: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property at any depth (objects, array items, unions, definitions), with its path."""
    if not isinstance(schema, dict):
        return
    for prop, sub in (schema.get("properties") or {}).items():
        yield f"{where}.{prop}", sub
        yield from _properties(sub, f"{where}.{prop}")
    for key in ("items", "additionalProperties"):
        yield from _properties(schema.get(key), f"{where}[]")
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            yield from _properties(sub, where)
    for definition, sub in (schema.get("$defs") or {}).items():
        yield from _properties(sub, f"{where}.$defs.{definition}")


async def _print_default_cost() -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        tools = await tools_of(Settings.build(data_dir=Path(data_dir)))
    for tool in sorted(tools, key=lambda t: -len(model_view(t).encode())):
        print(f"{len(model_view(tool).encode()):>7,}  {tool['name']}")
    print(f"{model_view_bytes(tools):>7,}  total for {len(tools)} tools (default toolsets)")


if __name__ == "__main__":
    anyio.run(_print_default_cost)
