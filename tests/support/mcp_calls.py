"""Calling tools through a real MCP `Client` and reading the answers (no doubles involved)."""

from __future__ import annotations

import base64
import secrets
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.outcomes import Unavailable

MODES = pytest.mark.parametrize("mode", ["auto", "legacy"])


async def call_ok(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The structured result of a call that must succeed."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, error_text(result)
    assert result.structured_content is not None
    return dict(result.structured_content)


async def call_error(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """The message of a call that must fail as a tool error (what the model sees)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool} should have failed: {result.structured_content}"
    return error_text(result)


def error_text(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def fresh_key(prefix: str = "test") -> str:
    return f"{prefix}:{secrets.token_hex(12)}"


def write_counters(client: SyncKvClient) -> dict[str, int | None]:
    """Engine counters that move on any stored PUT (either backend)."""
    stats = client.engine_stats()
    assert not isinstance(stats, Unavailable), stats
    return _writes(stats)


def _writes(stats: EngineStats) -> dict[str, int | None]:
    return {
        "unique_blocks": stats.unique_blocks,
        "total_refs": stats.total_refs,
        "put_new": stats.put_new,
        "dedup_hits": stats.dedup_hits,
    }
