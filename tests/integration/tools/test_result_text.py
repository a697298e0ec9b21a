"""A result's text block is its structured content as compact JSON (what a model reads and pays
for), over a real server and engine."""

from __future__ import annotations

import json

from mcp import Client
from mcp.types import TextContent

from graph_kvcache_mcp.server import build_server
from tests.support.engines import RunningEngine


async def test_kv_stats_text_is_the_structured_content_as_compact_json(
    memory_engine: RunningEngine,
) -> None:
    settings = memory_engine.settings.model_copy(update={"toolsets": ("kv",)})
    async with Client(build_server(settings)) as client:
        result = await client.call_tool("kv_stats", {})
    (block,) = result.content
    assert isinstance(block, TextContent) and result.structured_content is not None
    assert json.loads(block.text) == result.structured_content
    assert "\n" not in block.text and '": ' not in block.text
    indented = json.dumps(result.structured_content, indent=2)
    assert len(block.text) < 0.85 * len(indented)
