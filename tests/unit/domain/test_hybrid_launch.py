"""What vllm_start adds for a hybrid, per platform, and what it refuses before starting anything."""

from __future__ import annotations

import json
from typing import Any

import pytest

from graph_kvcache_mcp.domain.lmcache.config import LmcacheChoices, plan_lmcache
from graph_kvcache_mcp.domain.lmcache.model import read_geometry
from graph_kvcache_mcp.domain.vllm.launch import Platform, VllmLaunch, plan_launch
from graph_kvcache_mcp.errors import ConfigError
from tests.unit.domain.test_hybrid_layout import DATA, config, tiny

CPU = Platform(kind="cpu", detail="nvidia-smi not found on PATH")
GPU = Platform(kind="gpu", gpus=["NVIDIA H200, 143771 MiB"], detail="nvidia-smi listed 1 GPU")
HYBRID_FLAGS = (
    "--mamba-cache-mode",
    "--max-num-batched-tokens",
    "--max-num-seqs",
    "--hf-overrides",
)


def plan(raw: dict[str, Any] | None, platform: Platform = CPU, **given: Any) -> Any:
    return plan_launch(
        VllmLaunch(model="/m", **given), platform, host="127.0.0.1", model_config=raw
    )


def value(args: tuple[str, ...], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize(
    ("family", "key"), [("granite", "mamba_chunk_size"), ("nemotron", "chunk_size")]
)
def test_a_mamba2_hybrid_on_cpu_gets_the_recipe_with_the_block_vllm_will_use(
    family: str, key: str
) -> None:
    launched = plan(tiny(family))
    assert value(launched.args, "--block-size") == "128"
    # vLLM 0.32 and 0.33 derive align mode from prefix caching: the flag is never passed
    assert "--mamba-cache-mode" not in launched.args
    assert value(launched.args, "--max-num-batched-tokens") == "128"
    # the model's chunk (64) is under the block: raised to it, under the family's own key
    assert json.loads(value(launched.args, "--hf-overrides")) == {key: 128}
    assert "--max-num-seqs" not in launched.args
    assert any("chunk 64 < block 128" in note for note in launched.notes)


def test_a_small_block_keeps_the_chunk_and_caps_the_sequences_per_step() -> None:
    launched = plan(tiny("granite"), block_size=32)
    assert value(launched.args, "--max-num-batched-tokens") == "32"
    assert value(launched.args, "--max-num-seqs") == "32"
    assert "--hf-overrides" not in launched.args


def test_the_batch_is_the_raised_block_not_the_requested_one() -> None:
    launched = plan(config("granite-4.0-h"), block_size=32)
    assert value(launched.args, "--block-size") == "32"
    batch = int(value(launched.args, "--max-num-batched-tokens"))
    assert batch > 32 and batch % 32 == 0
    assert any("raises the requested 32" in note for note in launched.notes)


def test_a_gated_delta_net_needs_no_flags_and_says_so() -> None:
    launched = plan(config("qwen3.5"))
    assert not set(HYBRID_FLAGS) & set(launched.args)
    assert any("gated delta net" in note for note in launched.notes)


@pytest.mark.parametrize("name", ["jamba", "mamba"])
def test_mamba1_is_refused_on_cpu_with_the_reason(name: str) -> None:
    with pytest.raises(ConfigError, match=r"Mamba1.*selective_scan_fwd"):
        plan(config(name))


def test_mamba1_with_attention_starts_on_a_gpu() -> None:
    assert "--model" in plan(config("jamba"), GPU).args


@pytest.mark.parametrize("family", ["granite", "nemotron"])
def test_lmcache_mp_on_a_cpu_hybrid_is_refused_pointing_to_the_engine(family: str) -> None:
    with pytest.raises(ConfigError, match=r"KV cache groups.*kv_connector=engine"):
        plan(tiny(family), kv_connector="mp_native")


@pytest.mark.parametrize("model", ["granite", "qwen3.5"])
def test_the_engine_connector_moves_a_hybrid_on_a_gpu(model: str) -> None:
    # Qwen3.5 on an H200 with vLLM 0.33: GDN prefill checkpoints (block 576, one more state
    # block per request), which the connector's state placement does not depend on
    raw = tiny(model) if model == "granite" else config(model)
    launched = plan(raw, GPU, kv_connector="engine")
    transfer = json.loads(value(launched.args, "--kv-transfer-config"))
    assert transfer["kv_connector"] == "EngineKVConnector"
    assert any("on CUDA it copies through pinned host memory" in note for note in launched.notes)


def test_the_engine_connector_refuses_a_hybrid_on_several_gpu_ranks() -> None:
    # Per-rank keys are wired for a dense model's blocks only
    with pytest.raises(ConfigError, match=r"a hybrid's blocks for one rank.*2 ranks"):
        plan(tiny("granite"), GPU, kv_connector="engine", extra_args=("-tp", "2"))


def test_lmcache_mp_on_a_gpu_hybrid_steps_one_block_at_a_time() -> None:
    launched = plan(tiny("granite"), GPU, kv_connector="mp_native")
    assert value(launched.args, "--max-num-batched-tokens") == "16"
    assert "--mamba-cache-mode" not in launched.args
    assert "--hf-overrides" not in launched.args


def test_a_flag_given_in_extra_args_is_kept_and_noted() -> None:
    launched = plan(tiny("granite"), extra_args=("--max-num-batched-tokens", "256"))
    assert launched.args.count("--max-num-batched-tokens") == 1
    assert value(launched.args, "--max-num-batched-tokens") == "256"
    assert any("from extra_args kept" in note for note in launched.notes)


def test_a_dense_model_config_changes_nothing() -> None:
    dense = json.loads((DATA.parent / "models" / "llama-3.1-8b.config.json").read_text())
    assert plan(dense).args == plan(None).args


def test_lmcache_config_plans_a_hybrid_from_vllms_block_and_warns_about_cpu() -> None:
    model = read_geometry(tiny("nemotron")).facts
    gpu = plan_lmcache(model, LmcacheChoices())
    # NemotronH's float32 state (9,152 bytes) over 512-byte tokens: two 16-token kernel blocks
    assert (gpu.model.block_size, gpu.model.chunk_size) == (32, 256)
    argv = gpu.vllm.argv
    assert value(tuple(argv), "--max-num-batched-tokens") == "32"
    assert value(tuple(argv), "--max-num-seqs") == "32"
    assert any("cannot serve this NemotronH hybrid on CPU" in w for w in gpu.warnings)
    cpu = plan_lmcache(model, LmcacheChoices(cpu=True, vllm_block_size=128))
    assert cpu.model.block_size == 128 and cpu.model.chunk_size % 128 == 0
    assert any("kv_connector=engine" in w for w in cpu.warnings)


def test_a_gated_delta_net_behind_lmcache_on_an_h200_steps_one_576_token_block() -> None:
    # vLLM 0.33 on SM90: FlashInfer GDN prefill aligns the block to 64 (see test_gpu_rules)
    launched = plan(qwen3_next(), GPU, kv_connector="mp_native")
    assert value(launched.args, "--max-num-batched-tokens") == "576"
    assert "--mamba-cache-mode" not in launched.args
    assert any("align the block to 64" in note for note in launched.notes)


def qwen3_next() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (DATA.parent / "lmcache" / "qwen3-next-80b-a3b.config.json").read_text()
    )
    return loaded
