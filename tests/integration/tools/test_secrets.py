"""Tokens never appear in tool output, resources, prompts, logs or reprs."""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.state import AppState
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import b64

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("kv_stats", {}),
    ("kv_probe", {"samples": 2}),
    ("kv_put", {"key": "secrets:k", "value_b64": b64(b"v")}),
    ("kv_get", {"keys": ["secrets:k", "secrets:absent"], "include_value": True}),
    ("kv_exists", {"keys": ["secrets:k"]}),
    ("graph_kvcache", {"action": "stats"}),
    ("graph_kvcache", {"action": "get", "key": "secrets:k"}),
    ("graph_kvcache", {"action": "put", "key": "bad key", "value_b64": "x"}),  # an error path
    ("engine_status", {}),
    ("engine_start", {}),
    ("engine_stop", {}),
]


async def _everything_a_client_sees(settings: Settings) -> str:
    seen: list[str] = []
    async with Client(build_server(settings)) as client:
        for tool, arguments in CALLS:
            result = await client.call_tool(tool, arguments)
            seen += [getattr(block, "text", "") for block in result.content]
            seen.append(json.dumps(result.structured_content))
        seen += [
            getattr(c, "text", "") for c in (await client.read_resource("kv://stats")).contents
        ]
        prompt = await client.get_prompt("diagnose_kv_cache", {"symptom": "slow"})
        seen += [getattr(m.content, "text", "") for m in prompt.messages]
    return "\n".join(seen)


async def test_the_engine_token_never_appears_in_output_or_logs(
    memory_engine: RunningEngine,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    token = memory_engine.token.get_secret_value()
    seen = await _everything_a_client_sees(memory_engine.settings)
    captured = capfd.readouterr()
    assert "reachable" in seen  # the calls really ran
    for text in (seen, caplog.text, captured.out, captured.err):
        assert token not in text


async def test_a_wrong_token_is_reported_without_echoing_it(
    memory_engine: RunningEngine,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = f"wrong-{secrets.token_hex(16)}"
    settings = memory_engine.settings.model_copy(update={"kv_token": SecretStr(wrong)})
    seen = await _everything_a_client_sees(settings)
    captured = capfd.readouterr()
    assert "401" in seen and "does not match" in seen
    for text in (seen, caplog.text, captured.out, captured.err):
        assert wrong not in text


async def test_the_managed_engine_token_stays_out_of_output_logs_and_reprs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = Settings.build(data_dir=tmp_path, engine_backend="memory")
    managed = ManagedEngine(tmp_path)
    try:
        seen = await _everything_a_client_sees(settings)
        state = AppState(settings)
        await state.kv.connect()
        reprs = " ".join(repr(x) for x in (state, state.kv, settings))
        await state.aclose()
    finally:
        managed.stop(term_wait_s=5.0)
    token = managed.token().get_secret_value()
    captured = capfd.readouterr()
    assert "stored_new" in seen or "already_present" in seen
    for text in (seen, caplog.text, captured.out, captured.err, reprs):
        assert token not in text
