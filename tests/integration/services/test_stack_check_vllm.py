"""diagnose stack against a real vLLM: a healthy stack has no error nor warning; a vLLM
without prefix caching, without prompt-token details and short of KV memory fires each finding."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.diagnosis.stack_findings import StackDiagnosis
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.diagnosis.stack_check import check_stack
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import call_ok
from tests.support.vllm import BLOCK_SIZE, MODEL_NAME, RunningVllm, VllmServers
from tests.support.vllm_raw import raw_vllm

pytestmark = pytest.mark.vllm


def ids(out: StackDiagnosis) -> dict[str, str]:
    return {f.id: f.severity for f in out.findings}


async def test_a_healthy_stack_has_no_error_only_versions(
    durable_engine: RunningEngine, vllm_server: RunningVllm
) -> None:
    settings = durable_engine.settings.model_copy(
        update={"vllm_base_url": vllm_server.base_url, "toolsets": ("diagnose",)}
    )
    async with Client(build_server(settings)) as client:
        out = StackDiagnosis.model_validate(await call_ok(client, "diagnose_stack", {}))
    # The suite's vLLM runs from another data dir, so its runtime facts are named unreadable
    # from here (info), not silently left out.
    assert ids(out) == {"versions": "info", "runtime_not_readable": "info"}, out.findings
    found = {f.id: f for f in out.findings}
    assert "vLLM 0.32" in found["versions"].evidence
    assert found["runtime_not_readable"].evidence.startswith(
        f"not managed here: {vllm_server.base_url}"
    )
    assert all(c.reachable for c in out.checked) and len(out.checked) == 2


def test_the_cli_exits_0_for_a_healthy_stack_and_1_with_an_error(
    durable_engine: RunningEngine,
    vllm_server: RunningVllm,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", durable_engine.token.get_secret_value())
    engine = ("--url", durable_engine.base_url, "--data-dir", str(durable_engine.managed.data_dir))
    assert main(["diagnose", "stack", "--base-url", vllm_server.base_url, *engine, "--json"]) == 0
    healthy = json.loads(capsys.readouterr().out)
    assert {f["id"] for f in healthy["findings"]} == {"versions", "runtime_not_readable"}
    # A shared prefix shorter than a block is a warning: still exit 0.
    argv = ["diagnose", "stack", "--base-url", vllm_server.base_url, *engine]
    assert main([*argv, "--shared-prefix-tokens", str(BLOCK_SIZE - 1)]) == 0
    assert "vllm_block_larger_than_shared_prefix" in capsys.readouterr().out
    assert main([*argv, "--lmcache-url", "http://127.0.0.1:1"]) == 1
    assert "[error] lmcache_unreachable" in capsys.readouterr().out


async def test_prefix_caching_off_details_off_and_kv_pressure_fire_on_a_real_vllm(
    memory_engine: RunningEngine, vllm_private: VllmServers, tmp_path: Path
) -> None:
    vllm_private.stop_shared()
    with raw_vllm(
        tmp_path,
        "--no-enable-prefix-caching",
        max_model_len=1024,
        kv_cache_memory_bytes=2 * 1024 * 1024,  # 2048 tokens of the tiny model's KV
    ) as base_url:
        await _fill_kv_cache(base_url)
        settings = memory_engine.settings.model_copy(update={"vllm_base_url": base_url})
        async with VllmClient(base_url) as client:
            out = await check_stack(settings, client)
    found = ids(out)
    assert found["vllm_prefix_caching_off"] == "error"
    assert found["vllm_prompt_tokens_details_off"] == "warning"
    assert found["vllm_kv_pressure"] == "warning"
    pressure = next(f for f in out.findings if f.id == "vllm_kv_pressure")
    assert "preemptions" in pressure.evidence


async def _fill_kv_cache(base_url: str) -> None:
    """Four requests of up to 900 tokens each at once: more than the 2048 tokens of KV."""
    prompt = " ".join(f"word{i % 50}" for i in range(100))

    async def one(http: httpx.AsyncClient) -> None:
        reply = await http.post(
            base_url + "/completions",
            json={
                "model": MODEL_NAME,
                "prompt": prompt,
                "max_tokens": 600,
                "ignore_eos": True,
                "temperature": 0,
            },
        )
        reply.raise_for_status()

    async with httpx.AsyncClient(timeout=240) as http, anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(one, http)


async def test_a_managed_vllm_with_a_kv_connector_no_hash_seed_and_no_hits_is_flagged(
    memory_engine: RunningEngine,
    vllm_private: VllmServers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's ExampleConnector (KV saved to files) runs on CPU; the managed vLLM inherits our
    environment, where PYTHONHASHSEED is unset; one cold request makes the connector look up
    tokens and find none."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    transfer = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "kv")},
    }
    with vllm_private.private(extra_args=("--kv-transfer-config", json.dumps(transfer))) as server:
        settings = memory_engine.settings.model_copy(
            update={"vllm_base_url": server.base_url, "data_dir": server.managed.data_dir}
        )
        async with VllmClient(server.base_url) as client:
            await client.chat(
                [ChatMessage(role="user", content="a first, cold request")], max_tokens=1
            )
            out = await check_stack(settings, client)
    hash_seed = next(f for f in out.findings if f.id == "hash_seed_mismatch")
    assert "vLLM=unset" in hash_seed.evidence and "ExampleConnector" in hash_seed.evidence
    assert {f.id: f.severity for f in out.findings}["external_cache_never_hits"] == "warning"
