"""The kv://stats resource and the diagnose_kv_cache prompt, through a real Client."""

from __future__ import annotations

import re

from mcp import Client

from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES


@MODES
async def test_kv_stats_resource_serves_current_stats_as_json(
    engine: RunningEngine, mode: str
) -> None:
    async with Client(build_server(engine.settings), mode=mode) as client:
        listed = (await client.list_resources()).resources
        contents = (await client.read_resource("kv://stats")).contents
    assert [(r.uri, r.mime_type) for r in listed if r.uri == "kv://stats"] == [
        ("kv://stats", "application/json")
    ]
    out = KvStatsOut.model_validate_json(getattr(contents[0], "text", ""))
    assert (out.reachable, out.backend, out.base_url) == (True, engine.backend, engine.base_url)


@MODES
async def test_diagnose_prompt_walks_probe_then_stats_and_carries_the_symptom(
    memory_engine: RunningEngine, mode: str
) -> None:
    async with Client(build_server(memory_engine.settings), mode=mode) as client:
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        result = await client.get_prompt("diagnose_kv_cache", {"symptom": "hit rate is zero"})
    text = getattr(result.messages[0].content, "text", "")
    assert "diagnose_kv_cache" in prompts
    assert "Reported symptom: hit rate is zero" in text
    assert text.index("kv_probe") < text.index("kv_stats")


async def test_diagnose_prompt_walks_the_whole_stack_and_names_only_listed_tools(
    memory_engine: RunningEngine,
) -> None:
    async with Client(build_server(memory_engine.settings)) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        result = await client.get_prompt("diagnose_kv_cache", {})
    text = getattr(result.messages[0].content, "text", "")
    steps = ["diagnose_stack", "kv_probe", "vllm_status", "diagnose_miss", "lmcache_check"]
    assert [text.index(step) for step in steps] == sorted(text.index(step) for step in steps)
    named = set(re.findall(r"\b(?:kv|engine|vllm|bundle|diagnose|lmcache)_[a-z_]+\b", text))
    opt_in = {"lmcache_check", "lmcache_config"}  # the lmcache toolset is not on by default
    assert named - {"diagnose_kv_cache", "lmcache_url"} <= tools | opt_in
