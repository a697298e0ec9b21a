"""Hybrid models read family by family and laid out by vLLM's rules: state bytes from each
family's own keys, KV cache groups, the block vLLM will use on CPU and GPU, page padding, and
vLLM's "KV cache size: N tokens". The tiny granite / nemotron figures are vLLM 0.32's own log
lines (block 32, "Padding mamba page size by 79.02%", 260,111 / 258,111 tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graph_kvcache_mcp.domain.diagnosis.kv_budget import kv_budget
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts, read_geometry
from graph_kvcache_mcp.domain.vllm.hybrid.layout import hybrid_layout, kv_cache_tokens
from graph_kvcache_mcp.errors import ConfigError

DATA = Path(__file__).parents[2] / "data" / "hybrid"


def config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / f"{name}.config.json").read_text())
    return loaded


def facts(raw: dict[str, Any]) -> ModelFacts:
    return read_geometry(raw).facts


def tiny(family: str) -> dict[str, Any]:
    """The tiny hybrids of tests/support/tiny_hybrid.py, as transformers 5.19 writes them."""
    common = {
        "dtype": "bfloat16",
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    }
    if family == "granite":
        kinds = ["linear_attention", "full_attention"] * 2
        return {
            **common,
            "architectures": ["GraniteMoeHybridForCausalLM"],
            "model_type": "granitemoehybrid",
            "num_hidden_layers": 4,
            "layer_types": kinds,
            **{"mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16},
            **{"mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 1},
            "mamba_chunk_size": 64,
        }
    linear, full = "linear_attention", "full_attention"
    return {
        **common,
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "head_dim": 64,
        "layers_block_type": [linear, full, linear, linear, full, linear],
        **{"mamba_num_heads": 4, "mamba_head_dim": 32, "ssm_state_size": 16},
        **{"n_groups": 1, "conv_kernel": 4, "chunk_size": 64},
        "mamba_ssm_cache_dtype": "float32",
    }


@pytest.mark.parametrize(
    ("family", "groups", "tokens"), [("granite", 2, 260_111), ("nemotron", 3, 258_111)]
)
def test_tiny_hybrids_match_vllms_own_log_lines(family: str, groups: int, tokens: int) -> None:
    model = facts(tiny(family))
    layout = hybrid_layout(model, "cpu", block_size=32, prefix_caching=False)
    # conv (128 + 2*16) * 3 in bf16, ssm 4*32*16 in float32 (vLLM's CPU rule)
    assert layout.state_bytes_per_layer == 160 * 3 * 2 + 4 * 32 * 16 * 4 == 9152
    assert (layout.block_size, layout.block_raised) == (32, False)
    assert layout.page_bytes == 32 * 2 * 2 * 64 * 2
    assert layout.padding_pct == 79.02
    assert layout.kv_cache_groups == groups
    assert kv_cache_tokens(layout, model, kv_cache_bytes=268435456, max_model_len=4096) == tokens


def test_nemotron_h_without_num_hidden_layers_counts_its_pattern() -> None:
    geometry = read_geometry(tiny("nemotron"))
    assert geometry.facts.attention_layers == 2
    assert geometry.facts.hybrid is not None and geometry.facts.hybrid.linear_layers == 4
    assert any(i.name == "num_hidden_layers" and i.value == 6 for i in geometry.inputs)


def test_granite_4_h_state_and_the_block_vllm_raises_to() -> None:
    model = facts(config("granite-4.0-h"))
    hybrid = model.hybrid
    assert hybrid is not None and (hybrid.family, hybrid.model_family) == (
        "mamba2",
        "GraniteMoeHybrid",
    )
    conv = (2 * 4096 + 2 * 1 * 128) * 3
    ssm = 128 * 64 * 128
    assert hybrid.state_bytes_per_layer == (conv + ssm) * 2
    assert (model.attention_layers, hybrid.linear_layers) == (2, 6)
    per_token = 2 * 8 * 128 * 2
    cpu = hybrid_layout(model, "cpu")
    # float32 SSM on CPU: ceil(state / (128 * per_token)) blocks of 128
    assert cpu.block_size == 128 * -(-(conv * 2 + ssm * 4) // (128 * per_token)) == 1152
    gpu = hybrid_layout(model, "gpu")
    assert gpu.block_size == 16 * -(-(conv * 2 + ssm * 2) // (16 * per_token))
    assert (
        gpu.block_raised and cpu.kv_cache_groups == 3 + 1
    )  # 6 mamba in groups of 2, 2 attn in one


def test_nemotron_h_old_pattern_and_new_block_types_read_alike() -> None:
    old = facts(config("nemotron-h-pattern"))
    new = facts(config("nemotron-h-v5"))
    assert old.hybrid is not None and new.hybrid is not None
    assert (old.attention_layers, old.hybrid.linear_layers) == (2, 4)
    assert (new.attention_layers, new.hybrid.linear_layers) == (1, 3)
    # NemotronH's SSM state is float32 unless the config says otherwise
    assert old.hybrid.ssm_dtype == "float32" and new.hybrid.ssm_dtype == "bfloat16"
    assert old.hybrid.state_bytes_per_layer == (128 * 64 + 2 * 8 * 128) * 3 * 2 + 128 * 64 * 128 * 4


@pytest.mark.parametrize(
    ("name", "mixer", "attention", "recurrent", "conv", "ssm"),
    [
        ("falcon-h1", "mamba2", 4, 4, (3072 + 2 * 256) * 3, 64 * 64 * 256),
        ("zamba2", "mamba2", 2, 6, (4096 + 2 * 128) * 3, 64 * 64 * 128),
        ("bamba", "mamba2", 2, 6, (8192 + 2 * 128) * 3, 128 * 64 * 128),
        ("jamba", "mamba1", 1, 7, 8192 * 3, 8192 * 16),
    ],
)
def test_each_family_reads_its_own_keys(
    name: str, mixer: str, attention: int, recurrent: int, conv: int, ssm: int
) -> None:
    model = facts(config(name))
    assert model.hybrid is not None and model.hybrid.family == mixer
    assert (model.attention_layers, model.hybrid.linear_layers) == (attention, recurrent)
    assert model.hybrid.state_bytes_per_layer == (conv + ssm) * 2


def test_zamba2_attention_is_twice_the_hidden_width_per_head() -> None:
    model = facts(config("zamba2"))
    assert (model.kv_heads, model.head_dim) == (32, 2 * 2048 // 32)


def test_qwen3_5_reads_its_text_config_and_keeps_its_float32_ssm() -> None:
    model = facts(config("qwen3.5"))
    hybrid = model.hybrid
    assert hybrid is not None and (hybrid.family, hybrid.model_family) == ("gdn", "Qwen3.5")
    conv = (128 * 16 * 2 + 128 * 16) * 3 * 2
    assert hybrid.state_bytes_per_layer == conv + 16 * 128 * 128 * 4
    assert (model.attention_layers, hybrid.linear_layers) == (2, 6)
    assert hybrid_layout(model, "gpu").mamba_cache_mode == "align"


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_an_attention_free_model_is_refused_by_name(name: str) -> None:
    with pytest.raises(ConfigError, match="attention-free"):
        facts(config(name))


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("granite-4.0-h", "mamba_d_state"),
        ("nemotron-h-pattern", "ssm_state_size"),
        ("qwen3.5", "linear_num_value_heads"),
        ("zamba2", "n_mamba_heads"),
        ("jamba", "mamba_d_conv"),
    ],
)
def test_a_missing_state_key_is_an_error_naming_it(name: str, missing: str) -> None:
    raw = config(name)
    target = raw.get("text_config", raw)
    del target[missing]
    with pytest.raises(ConfigError, match=missing):
        facts(raw)


def test_a_larger_requested_block_is_kept_and_padding_follows_it() -> None:
    model = facts(tiny("granite"))
    layout = hybrid_layout(model, "cpu", block_size=256)
    assert (layout.block_size, layout.block_raised) == (256, False)
    assert layout.page_bytes == 256 * 512 and layout.block_bytes == 2 * 256 * 512


def test_the_budget_of_a_hybrid_counts_tokens_as_vllm_does() -> None:
    budget = kv_budget(
        tiny("nemotron"),
        kv_memory_gib=0.25,
        block_size=32,
        platform="cpu",
        max_model_len=4096,
        prefix_caching=False,
    )
    assert budget.tokens_fit == 258_111  # attention bytes alone would say 262,144
    assert budget.hybrid is not None and budget.hybrid.layout.kv_cache_groups == 3
    assert (budget.block_size, budget.block_bytes) == (32, 2 * 16384)
    # on a GPU the SSM state keeps the config's float32 and the block is FlashAttention's 16
    gpu = kv_budget(tiny("nemotron"), platform="gpu")
    assert gpu.hybrid is not None and gpu.hybrid.layout.block_size == 16 * 2
