"""A refused or malformed endpoint disables the toolsets that need it, never the server: the
other tools serve, and the refused ones keep their schemas and answer with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client, MCPError

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.endpoints import INSECURE_HOSTS_ENV
from graph_kvcache_mcp.server import build_server
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, call_error, call_ok

REMOTE_VLLM = "http://10.0.0.18:8000/v1"


def _env(engine: RunningEngine, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "EPISTEMIC_GRAPH_KVCACHE_URL": engine.base_url,
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": engine.token.get_secret_value(),
        "GRAPH_KVCACHE_DATA_DIR": str(tmp_path),
        "GRAPH_KVCACHE_TOOLSETS": "kv,engine,vllm,bundle,lmcache,compat",
        **extra,
    }


async def _tools_list(settings: Settings) -> str:
    async with Client(build_server(settings)) as client:
        tools = (await client.list_tools()).tools
    return json.dumps([tool.model_dump(mode="json", by_alias=True) for tool in tools])


@MODES
@pytest.mark.parametrize("vllm_url", [REMOTE_VLLM, "ftp://10.0.0.18/v1", "http://"])
async def test_a_refused_vllm_url_leaves_the_kv_tools_serving_and_vllm_tools_saying_why(
    memory_engine: RunningEngine, tmp_path: Path, mode: str, vllm_url: str
) -> None:
    env = _env(memory_engine, tmp_path, VLLM_BASE_URL=vllm_url)
    settings = Settings.from_env(env, defer_endpoint_errors=True)
    async with Client(build_server(settings), mode=mode) as client:
        stats = await call_ok(client, "kv_stats", {})
        engine = await call_ok(client, "engine_status", {})
        refused = [
            await call_error(client, "vllm_metrics", {}),
            await call_error(client, "vllm_chat", {"message": "hi", "model": "m"}),
            await call_error(client, "bundle_render", {"key": "ctxbundle:00", "turn_text": "hi"}),
        ]
    assert stats["reachable"] and engine["kv_source"] == "configured"
    for message in refused:
        assert "disabled on this server" in message and "VLLM_BASE_URL" in message
        if vllm_url == REMOTE_VLLM:
            assert INSECURE_HOSTS_ENV in message and "https://" in message


async def test_refused_toolsets_keep_their_schemas(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    healthy = Settings.from_env(_env(memory_engine, tmp_path), defer_endpoint_errors=True)
    refused = Settings.from_env(
        _env(memory_engine, tmp_path, VLLM_BASE_URL=REMOTE_VLLM), defer_endpoint_errors=True
    )
    assert await _tools_list(refused) == await _tools_list(healthy)


async def test_a_refused_engine_url_disables_the_kv_side_and_its_resource(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    env = _env(memory_engine, tmp_path, EPISTEMIC_GRAPH_KVCACHE_URL="http://kv.example.com:9130")
    settings = Settings.from_env(env, defer_endpoint_errors=True)
    async with Client(build_server(settings)) as client:
        messages = [
            await call_error(client, "kv_stats", {}),
            await call_error(client, "graph_kvcache", {"action": "stats"}),
            await call_error(client, "engine_status", {}),
            await call_error(client, "lmcache_check", {}),
        ]
        summary = await call_ok(client, "vllm_trace_summary", {})
        with pytest.raises(MCPError) as resource:
            await client.read_resource("kv://stats")
    for message in messages:
        assert "EPISTEMIC_GRAPH_KVCACHE_URL" in message and INSECURE_HOSTS_ENV in message
    assert "EPISTEMIC_GRAPH_KVCACHE_URL" in str(resource.value)
    assert summary["source"] == "session"
    assert not (tmp_path / "engine").exists()  # no managed engine started in its place
