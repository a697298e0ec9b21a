"""The diagnose_* tools through a real MCP Client."""

from __future__ import annotations

import json
from pathlib import Path

from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.diagnosis.kv_budget import KvBudget
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.diagnosis.prefix_miss import MissDiagnosis
from tests.support.mcp_calls import call_error, call_ok

MODELS = Path(__file__).resolve().parents[2] / "data" / "models"


def settings(tmp_path: Path) -> Settings:
    return Settings.build(data_dir=tmp_path, toolsets=("diagnose",))


async def test_diagnose_budget_takes_a_path_or_the_config_object(tmp_path: Path) -> None:
    path = MODELS / "llama-3.1-70b.config.json"
    async with Client(build_server(settings(tmp_path))) as client:
        by_path = await call_ok(client, "diagnose_budget", {"hf_config": str(path)})
        by_object = await call_ok(
            client,
            "diagnose_budget",
            {"hf_config": json.loads(path.read_text()), "kv_memory_gib": 40, "chunk_size": 256},
        )
    assert KvBudget.model_validate(by_path).bytes_per_token == 80 * 8 * 128 * 2 * 2
    budget = KvBudget.model_validate(by_object)
    assert budget.tokens_fit == 40 * 2**30 // 327680
    read = {item.source for item in budget.inputs}
    assert "hf_config object" in read and "config.json" not in read  # no file was read
    assert "config.json" in {item.source for item in KvBudget.model_validate(by_path).inputs}
    assert budget.chunk is not None and budget.chunk.over_engine_value_cap


async def test_diagnose_budget_refuses_a_missing_file_a_bad_dtype_and_a_path_outside_roots(
    tmp_path: Path,
) -> None:
    path = str(MODELS / "llama-3.1-8b.config.json")
    absent = str(MODELS / "absent.config.json")  # inside the roots (the working directory)
    async with Client(build_server(settings(tmp_path))) as client:
        missing = await call_error(client, "diagnose_budget", {"hf_config": absent})
        dtype = await call_error(client, "diagnose_budget", {"hf_config": path, "kv_dtype": "q"})
        outside = await call_error(client, "diagnose_budget", {"hf_config": "/nonexistent/x"})
    assert f"no config.json to read ({absent} does not exist)" in missing
    assert "diagnose_budget again" in missing
    assert "unknown KV dtype 'q'" in dtype
    assert "outside the allowed roots" in outside and "GRAPH_KVCACHE_FILE_ROOTS" in outside


async def test_diagnose_miss_reports_a_stopped_vllm_as_unreachable(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    settings = Settings.build(
        data_dir=tmp_path, toolsets=("diagnose",), vllm_base_url=url, vllm_model="m"
    )
    request = {"messages": [{"role": "user", "content": "hi"}]}
    async with Client(build_server(settings)) as client:
        out = MissDiagnosis.model_validate(
            await call_ok(client, "diagnose_miss", {"first": request, "second": request})
        )
    assert not out.reachable and out.reason and "not reachable" in out.reason


async def test_diagnose_miss_refuses_a_body_without_messages(tmp_path: Path) -> None:
    request = {"messages": [{"role": "user", "content": "hi"}]}
    async with Client(build_server(settings(tmp_path))) as client:
        message = await call_error(
            client, "diagnose_miss", {"first": {"prompt": "hi"}, "second": request}
        )
    assert "first is not a chat-completions body" in message


async def test_diagnose_stack_with_nothing_configured_names_the_managed_engine_not_a_port(
    tmp_path: Path,
) -> None:
    unused_vllm = f"http://127.0.0.1:{free_port()}/v1"
    base = Settings.build(data_dir=tmp_path, toolsets=("diagnose",))
    settings = base.model_copy(update={"vllm_base_url": unused_vllm})
    async with Client(build_server(settings)) as client:
        out = await call_ok(client, "diagnose_stack", {})
    (engine,) = [c for c in out["checked"] if c["component"] == "engine"]
    assert engine["target"] == f"managed engine in {tmp_path}"
    assert "9130" not in json.dumps(out)
    assert "engine_not_started" in {f["id"] for f in out["findings"]}


async def test_diagnose_budget_lays_a_hybrid_out_for_the_platform_asked_and_names_the_stored_state(
    tmp_path: Path,
) -> None:
    """As the CLI: an agent on a CPU host can ask for the GPU layout (#39 item 4), and the answer
    says which state size vLLM stores (float32 on CPU, the model's bf16 on GPU)."""
    hybrid = str(MODELS.parent / "hybrid" / "bamba.config.json")
    arguments = {"hf_config": hybrid, "kv_memory_gib": 4, "max_model_len": 4096}
    async with Client(build_server(settings(tmp_path))) as client:
        answers = {
            platform: KvBudget.model_validate(
                await call_ok(client, "diagnose_budget", {**arguments, "platform": platform})
            )
            for platform in ("cpu", "gpu")
        }
        unaligned = KvBudget.model_validate(
            await call_ok(
                client,
                "diagnose_budget",
                {**arguments, "platform": "gpu", "no_prefix_caching": True},
            )
        )
    cpu, gpu = answers["cpu"], answers["gpu"]
    assert cpu.hybrid is not None and cpu.hybrid.layout.platform == "cpu"
    assert gpu.hybrid is not None and gpu.hybrid.layout.platform == "gpu"
    assert gpu.hybrid.max_model_len == 4096 and gpu.hybrid.kv_cache_tokens is not None
    assert unaligned.hybrid is not None
    assert unaligned.hybrid.layout.mamba_cache_mode != gpu.hybrid.layout.mamba_cache_mode
    cpu_state, gpu_state = cpu.recurrent_state, gpu.recurrent_state
    assert cpu_state is not None and gpu_state is not None
    assert (cpu_state.vllm_ssm_dtype, gpu_state.vllm_ssm_dtype) == ("float32", gpu_state.ssm_dtype)
    assert gpu_state.vllm_bytes_per_sequence == gpu_state.bytes_per_sequence
    assert cpu_state.vllm_bytes_per_sequence is not None and gpu_state.bytes_per_sequence
    assert cpu_state.vllm_bytes_per_sequence > gpu_state.bytes_per_sequence
    assert any("vLLM stores it in float32 on CPU" in note for note in cpu.notes)


async def test_diagnose_budget_on_a_named_card_follows_its_vllm_rules(tmp_path: Path) -> None:
    """platform=h100 applies vLLM 0.33's Hopper rule to a gated delta net (576-token blocks,
    one more state block per request); a100 keeps 544 and fits more tokens."""
    qwen3_next = str(MODELS.parent / "lmcache" / "qwen3-next-80b-a3b.config.json")
    arguments = {"hf_config": qwen3_next, "kv_memory_gib": 40, "max_model_len": 32768}
    async with Client(build_server(settings(tmp_path))) as client:
        h100, a100 = [
            KvBudget.model_validate(
                await call_ok(client, "diagnose_budget", {**arguments, "platform": card})
            )
            for card in ("h100", "a100")
        ]
    assert (h100.block_size, a100.block_size) == (576, 544)
    assert h100.tokens_fit is not None and a100.tokens_fit is not None
    assert h100.tokens_fit < a100.tokens_fit
    assert h100.hybrid is not None and h100.hybrid.layout.gpu == "h100"
