"""Known secrets never leak: the real server over HTTP (a known bearer token), its managed engine,
and a real vLLM started through `vllm_start` with a known VLLM_API_KEY, plus a known bundle
secret. Every tool is called; every answer, the server's output, and every file under the data dir
(logs, state, stores) is searched for the secret values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from graph_kvcache_mcp.connectors.processes.ports import free_port
from tests.support.http_server import http_server
from tests.support.mcp_calls import b64, fresh_key
from tests.support.vllm import (
    BLOCK_SIZE,
    MODEL_NAME,
    VllmServers,
    offline_environment,
    require_vllm_venv,
    tiny_model_dir,
)

HTTP_TOKEN = "secret-http-token-3c9f1a7e55d24b08"
VLLM_API_KEY = "secret-vllm-api-key-8e21d0c4b7a9f613"
BUNDLE_SECRET = "secret-bundle-hmac-5a7c3e9d1f0b2468"
SECRETS = (HTTP_TOKEN, VLLM_API_KEY, BUNDLE_SECRET)
ITEMS = [
    {"id": "a", "text": "The engine keeps the first value stored under a key."},
    {"id": "b", "text": "vLLM reuses KV blocks for a shared prompt prefix."},
]


def _calls(tmp_path: Path, model_dir: Path, vllm_port: int) -> list[tuple[str, dict[str, Any]]]:
    """Every tool with arguments that make it do its real work, in an order that lets it."""
    key = fresh_key("secrets")
    (tmp_path / "value.bin").write_bytes(b"value from a file")
    return [
        ("engine_start", {}),
        ("engine_status", {}),
        ("kv_stats", {}),
        ("kv_probe", {}),
        ("kv_put", {"key": key, "value_b64": b64(b"secret-free value")}),
        ("kv_put", {"key": fresh_key("file"), "file_path": str(tmp_path / "value.bin")}),
        ("kv_get", {"keys": [key, fresh_key("missing")], "include_value": True}),
        ("kv_exists", {"keys": [key]}),
        ("kv_save", {"key": key, "path": str(tmp_path / "saved.bin")}),
        ("graph_kvcache", {"action": "stats"}),
        ("graph_kvcache", {"action": "get", "key": key}),
        ("lmcache_config", {"model": "m/x", "num_layers": 2, "kv_heads": 2, "head_dim": 64}),
        ("lmcache_check", {"page_bytes": 4096}),
        (
            "vllm_start",
            {
                "model": str(model_dir),
                "port": vllm_port,
                "served_model_name": MODEL_NAME,
                "max_model_len": 4096,
                "dtype": "bfloat16",
                "block_size": BLOCK_SIZE,
                "kv_cache_memory_bytes": 256 * 1024 * 1024,
                "dev_mode": True,
                "extra_args": ["--enforce-eager"],
            },
        ),
        ("vllm_status", {}),
        ("vllm_chat", {"message": "Say hi.", "model": MODEL_NAME, "max_tokens": 4}),
        ("vllm_metrics", {"model": MODEL_NAME}),
        ("vllm_logs", {"lines": 200}),
        ("vllm_trace_summary", {}),
        ("vllm_reset_prefix_cache", {}),
        ("bundle_compile", {"query": "What is reused?", "items": ITEMS, "include_text": True}),
        ("bundle_reuse_measure", {"bundles": 1, "items_per_bundle": 2, "max_tokens": 1}),
        ("vllm_stop", {}),
        ("engine_stop", {}),
    ]


async def _exercise(url: str, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Every answer as text: the listed tools (any not in `calls` with no arguments), the
    resource and the prompt, and the 401 a wrong token gets."""
    answers: list[str] = []
    async with httpx2.AsyncClient() as anonymous:
        wrong = await anonymous.post(url, json={}, headers={"Authorization": "Bearer nope"})
        answers.append(f"{wrong.status_code} {wrong.headers} {wrong.text}")
    headers = {"Authorization": f"Bearer {HTTP_TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(900)) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        listed = (await client.list_tools()).tools
        answers.append(json.dumps([tool.model_dump(mode="json") for tool in listed]))
        called: set[str] = set()
        planned = {*dict(calls), "bundle_render", "bundle_chat"}
        pending = [*calls, *((tool.name, {}) for tool in listed if tool.name not in planned)]
        for name, arguments in pending:
            if name == "vllm_stop":  # the bundle tools need vLLM: render and chat go first
                bundle_key = _bundle_key(answers)
                for tool in ("bundle_render", "bundle_chat"):
                    args = {
                        "key": bundle_key,
                        "turn_text": "hi",
                        **({"max_tokens": 2} if tool == "bundle_chat" else {}),
                    }
                    answers.append(await _call(client, tool, args, called))
            answers.append(await _call(client, name, arguments, called))
        answers.append((await client.read_resource("kv://stats")).model_dump_json())
        prompt = await client.get_prompt("diagnose_kv_cache", {"symptom": "misses"})
        answers.append(prompt.model_dump_json())
    missing = {tool.name for tool in listed} - called
    assert not missing, f"tools never exercised: {sorted(missing)}"
    return answers


async def _call(client: Client, name: str, arguments: dict[str, Any], called: set[str]) -> str:
    result = await client.call_tool(name, arguments)
    called.add(name)
    return f"{name} is_error={result.is_error} {result.model_dump_json()}"


def _bundle_key(answers: list[str]) -> str:
    for answer in answers:
        if answer.startswith("bundle_compile is_error=False"):
            structured = json.loads(answer.split(" ", 2)[2])["structured_content"]
            return str(structured["key"])
    raise AssertionError("bundle_compile did not succeed")


@pytest.mark.vllm
def test_no_secret_reaches_any_answer_log_or_file(
    vllm_private: VllmServers, tmp_path: Path
) -> None:
    vllm_private.stop_shared()  # one vLLM at a time: this test starts its own through the tool
    python, model_dir, data_dir = require_vllm_venv(), tiny_model_dir(), tmp_path / "data"
    env = {
        "GRAPH_KVCACHE_HTTP_TOKEN": HTTP_TOKEN,
        "VLLM_API_KEY": VLLM_API_KEY,
        "GRAPH_KVCACHE_BUNDLE_SECRET": BUNDLE_SECRET,
        "GRAPH_KVCACHE_DATA_DIR": str(data_dir),
        "GRAPH_KVCACHE_TOOLSETS": "kv,engine,vllm,bundle,lmcache,compat",
        "GRAPH_KVCACHE_FILE_ROOTS": str(tmp_path),
        "GRAPH_KVCACHE_VLLM_PYTHON": str(python),
        **offline_environment(tmp_path / "vllm-cache"),
    }
    vllm_port = free_port()
    env["VLLM_BASE_URL"] = f"http://127.0.0.1:{vllm_port}/v1"
    with http_server(env, "--start-engine") as server:
        answers = anyio.run(_exercise, server.url, _calls(tmp_path, model_dir, vllm_port))
    ok = [answer.split(" ", 1)[0] for answer in answers if " is_error=False " in answer]
    assert {"vllm_chat", "bundle_chat", "lmcache_check", "kv_put"} <= set(ok), answers
    files = [path for path in data_dir.rglob("*") if path.is_file()]
    assert any(path.name.endswith(".log") for path in files)  # vLLM's and the engine's logs
    haystacks = {f"answer {i}": text.encode() for i, text in enumerate(answers)}
    haystacks["server stdout+stderr"] = server.stderr.encode()
    haystacks.update({str(path): path.read_bytes() for path in files})
    leaks = [
        (where, secret[:12])
        for where, text in haystacks.items()
        for secret in SECRETS
        if secret.encode() in text
    ]
    assert leaks == []
