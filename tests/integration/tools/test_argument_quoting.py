"""Every tool error quotes at most ~200 characters of any argument, with its length: a 100 KB
argument sent to each tool that names its arguments in errors comes back as a short message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.server import build_server
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import call_error

MODELS = Path(__file__).resolve().parents[2] / "data" / "models"
LLAMA = json.loads((MODELS / "llama-3.1-8b.config.json").read_text())
HUGE = 100_000
BIG = "x" * HUGE
WORDS = "s" + "9" * (HUGE - 1)
LIMIT = 1_000  # the whole message, quoted argument and all

CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "kv_stats since": ("kv_stats", {"since": BIG}),
    "vllm_metrics since": ("vllm_metrics", {"since": WORDS}),
    "kv_put file_path": ("kv_put", {"key": "k", "file_path": "/" + BIG}),
    "kv_save path": ("kv_save", {"key": "k", "path": "/" + BIG}),
    "vllm_trace_summary path": ("vllm_trace_summary", {"path": "/" + BIG}),
    "diagnose_budget hf_config": ("diagnose_budget", {"hf_config": "/" + BIG}),
    "diagnose_budget kv_dtype": ("diagnose_budget", {"hf_config": LLAMA, "kv_dtype": BIG}),
    "diagnose_stack lmcache_url": ("diagnose_stack", {"lmcache_url": "http://" + BIG}),
    "kv_get keys": ("kv_get", {"keys": [BIG]}),
    "an unknown tool's name": (BIG, {}),
}


@pytest.mark.parametrize("case", sorted(CALLS))
async def test_an_error_quotes_a_huge_argument_briefly_with_its_length(
    memory_engine: RunningEngine, case: str
) -> None:
    tool, arguments = CALLS[case]
    closed = f"http://127.0.0.1:{free_port()}/v1"
    settings = memory_engine.settings.model_copy(
        update={
            "vllm_base_url": closed,
            "toolsets": ("kv", "engine", "vllm", "diagnose"),
        }
    )
    async with Client(build_server(settings)) as client:
        if tool == BIG:
            with pytest.raises(Exception) as caught:
                await client.call_tool(tool, arguments)
            message = str(caught.value)
        else:
            message = await call_error(client, tool, arguments)
    assert len(message) < LIMIT, (case, len(message), message[:300])
    assert f"{HUGE}" in message or f"{HUGE + 1}" in message or f"{HUGE + 7}" in message, message
