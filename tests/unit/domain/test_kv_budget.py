"""The KV budget of published architectures, against values computed by hand from their
config.json facts (tests/data/models/ and tests/data/lmcache/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from graph_kvcache_mcp.domain.diagnosis.kv_budget import GIB, kv_budget
from graph_kvcache_mcp.domain.lmcache.config import ENGINE_VALUE_CAP_BYTES
from graph_kvcache_mcp.errors import ConfigError

DATA = Path(__file__).resolve().parents[2] / "data"


def config(name: str) -> dict[str, Any]:
    folder = "lmcache" if name.startswith("qwen3") else "models"
    loaded: dict[str, Any] = json.loads((DATA / folder / f"{name}.config.json").read_text())
    return loaded


@pytest.mark.parametrize(
    ("name", "bytes_per_token"),
    [
        ("llama-3.1-8b", 32 * 8 * 128 * 2 * 2),  # head_dim = 4096 / 32
        ("llama-3.1-70b", 80 * 8 * 128 * 2 * 2),  # head_dim = 8192 / 64
        ("qwen3-8b", 36 * 8 * 128 * 2 * 2),
        ("deepseek-v3", 61 * (512 + 64) * 2),  # MLA: kv_lora_rank + qk_rope_head_dim
    ],
)
def test_full_attention_models_cost_layers_times_heads_times_head_dim_times_two_per_token(
    name: str, bytes_per_token: int
) -> None:
    budget = kv_budget(config(name))
    assert budget.bytes_per_token == bytes_per_token
    assert budget.sliding_window is None and budget.recurrent_state is None


def test_tokens_fit_is_the_memory_divided_by_bytes_per_token_rounded_down() -> None:
    budget = kv_budget(config("llama-3.1-8b"), kv_memory_gib=10)
    assert budget.tokens_fit == 10 * 2**30 // 131072 == 81920
    deepseek = kv_budget(config("deepseek-v3"), kv_memory_gib=1.5)
    assert deepseek.tokens_fit == int(1.5 * GIB) // 70272 == 22919


def test_an_fp8_kv_cache_halves_the_bytes_and_says_the_dtype_was_given() -> None:
    budget = kv_budget(config("llama-3.1-70b"), kv_dtype="fp8")
    assert (budget.bytes_per_token, budget.dtype_bytes) == (163840, 1)
    assert [(i.value, i.source) for i in budget.inputs if i.name == "kv_dtype"] == [
        ("fp8", "given")
    ]


def test_every_input_names_its_source() -> None:
    sources = {i.name: (i.value, i.source) for i in kv_budget(config("llama-3.1-8b")).inputs}
    assert sources["num_hidden_layers"] == (32, "config.json")
    assert sources["num_key_value_heads"] == (8, "config.json")
    assert sources["head_dim"] == (128, "hidden_size / num_attention_heads")
    assert sources["kv_dtype"] == ("bfloat16", "config.json")


def test_gemma3_sliding_layers_are_bounded_by_their_window_and_reported_apart() -> None:
    budget = kv_budget(config("gemma-3-27b"), kv_memory_gib=1)
    # 62 layers, every 6th global: 10 full-attention layers, 52 windowed to 1024 tokens.
    assert budget.full_attention_layers == 10
    assert budget.bytes_per_token == 10 * 16 * 128 * 2 * 2 == 81920
    assert budget.sliding_window is not None
    assert budget.sliding_window.layers == 52
    assert budget.sliding_window.bytes_per_token == 52 * 16 * 128 * 2 * 2
    assert budget.sliding_window.bytes_per_sequence == 52 * 8192 * 1024 == 436207616
    assert budget.tokens_fit == 2**30 // 81920 == 13107


def test_an_all_windowed_mistral_counts_its_windowed_bytes_and_says_so() -> None:
    budget = kv_budget(config("mistral-7b-v0.1"), kv_memory_gib=1)
    assert (budget.full_attention_layers, budget.bytes_per_token) == (0, 0)
    assert budget.sliding_window is not None
    assert budget.sliding_window.bytes_per_sequence == 32 * 8 * 128 * 2 * 2 * 4096
    assert budget.tokens_fit == 2**30 // 131072 == 8192
    assert any("windowed" in n for n in budget.notes)


def test_a_qwen2_window_that_is_switched_off_is_ignored() -> None:
    raw = {**config("llama-3.1-8b"), "sliding_window": 131072, "use_sliding_window": False}
    assert kv_budget(raw).sliding_window is None


def test_qwen3_next_reports_its_gated_delta_net_state_per_sequence() -> None:
    budget = kv_budget(config("qwen3-next-80b-a3b"))
    # 48 layers, every 4th full attention: 12 attention layers (2 KV heads of 256).
    assert budget.bytes_per_token == 12 * 2 * 256 * 2 * 2 == 24576
    assert budget.recurrent_state is not None
    conv = (128 * 16 * 2 + 128 * 32) * (4 - 1) * 2
    temporal = 32 * 128 * 128 * 2
    assert (budget.recurrent_state.family, budget.recurrent_state.layers) == ("gdn", 36)
    assert budget.recurrent_state.bytes_per_sequence == 36 * (conv + temporal) == 39518208


def test_a_chunk_over_the_engine_value_cap_is_flagged() -> None:
    small = kv_budget(config("llama-3.1-8b"), chunk_size=256)
    assert small.chunk is not None
    assert (small.chunk.chunk_bytes, small.chunk.over_engine_value_cap) == (256 * 131072, False)
    large = kv_budget(config("llama-3.1-70b"), chunk_size=256)
    assert large.chunk is not None
    assert large.chunk.chunk_bytes == 256 * 327680 > ENGINE_VALUE_CAP_BYTES
    assert large.chunk.over_engine_value_cap and any("value cap" in n for n in large.notes)


def test_block_bytes_are_block_size_times_bytes_per_token() -> None:
    assert kv_budget(config("qwen3-8b"), block_size=16).block_bytes == 16 * 147456


@pytest.mark.parametrize(
    ("raw", "options", "message"),
    [
        ({"_name_or_path": "x/y", "num_hidden_layers": 2}, {}, "num_attention_heads"),
        ({"_name_or_path": "x/y"}, {}, "num_hidden_layers"),
        ("llama-3.1-8b", {"kv_dtype": "fp4x"}, "unknown KV dtype"),
        ("llama-3.1-8b", {"kv_memory_gib": 0}, "kv_memory_gib"),
    ],
)
def test_bad_input_names_what_is_wrong(raw: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        kv_budget(config(raw) if isinstance(raw, str) else raw, **options)
