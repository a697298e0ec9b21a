"""Every number of a model config is bounded and cross-checked: a broken config is a
`ConfigError` naming the field, never another exception and never a silent nonsense budget."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.diagnosis.kv_budget import kv_budget
from graph_kvcache_mcp.errors import ConfigError

BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}

FIELDS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "head_dim",
    "sliding_window",
    "sliding_window_pattern",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "layer_types",
    "hybrid_override_pattern",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "full_attention_interval",
    "mamba_num_heads",
    "ssm_state_size",
)

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-4, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(st.sampled_from(["full_attention", "sliding_attention", "linear_attention"])),
    st.text(alphabet="M*-", max_size=80),
)


@settings(max_examples=400, deadline=None)
@given(
    overrides=st.dictionaries(st.sampled_from(FIELDS), numbers, max_size=6),
    memory=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    chunk=st.one_of(st.none(), st.integers(min_value=-5, max_value=10**12)),
)
def test_any_config_gives_a_sane_budget_or_a_config_error(
    overrides: dict[str, Any], memory: float | None, chunk: int | None
) -> None:
    config = {**BASE, **overrides}
    try:
        budget = kv_budget(config, kv_memory_gib=memory, chunk_size=chunk)
    except ConfigError as exc:
        assert str(exc) and len(str(exc)) < 600
        return
    assert budget.full_attention_layers >= 0
    if budget.bytes_per_token is not None:
        assert 0 <= budget.bytes_per_token < 2**63
    if budget.tokens_fit is not None:
        assert budget.tokens_fit >= 0
    if budget.kv_memory_gib is not None:
        assert math.isfinite(budget.kv_memory_gib)


@settings(max_examples=200, deadline=None)
@given(
    layers=st.integers(1, 512),
    groups=st.integers(1, 16),
    kv_heads=st.integers(1, 64),
    head_dim=st.sampled_from([32, 64, 80, 96, 128, 256]),
)
def test_a_consistent_dense_config_is_sized_as_vllm_sizes_it(
    layers: int, groups: int, kv_heads: int, head_dim: int
) -> None:
    heads = kv_heads * groups
    config = {
        **BASE,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_size": heads * head_dim,
    }
    budget = kv_budget(config, kv_memory_gib=1.0)
    assert budget.bytes_per_token == 2 * kv_heads * head_dim * 2 * layers
    assert budget.tokens_fit == 2**30 // budget.bytes_per_token


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"num_attention_heads": -4}, "num_attention_heads"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"num_hidden_layers": 10**30}, "num_hidden_layers"),
        ({"num_key_value_heads": 64, "num_attention_heads": 4}, "num_key_value_heads"),
        ({"sliding_window": -1}, "sliding_window"),
        ({"layer_types": ["full_attention"] * 1_000_000, "num_hidden_layers": 2}, "layer_types"),
        ({"hidden_size": 4097}, "hidden_size"),
    ],
)
def test_each_broken_field_is_named(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        kv_budget({**BASE, **overrides})


@pytest.mark.parametrize("memory", [1e308, math.inf, -math.inf, math.nan, 0.0, -1.0])
def test_kv_memory_must_be_finite_positive_and_bounded(memory: float) -> None:
    with pytest.raises(ConfigError, match="kv_memory_gib"):
        kv_budget(BASE, kv_memory_gib=memory)


def test_json_nested_100k_deep_is_refused_without_recursion() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ConfigError, match="nests deeper"):
        kv_budget({**BASE, "extra": deep})
