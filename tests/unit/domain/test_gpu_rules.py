"""vLLM 0.33's gated-delta-net checkpoint rule, read from its source (`_align_hybrid_block_size`,
the GDN prefill backend choice, `MambaSpec.max_memory_usage_bytes`), beside 0.32's: Qwen3-Next
on an H100 gets 576-token blocks and 3 state blocks per request; A100, CPU and 0.32 keep 544."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.domain.diagnosis.kv_budget import kv_budget
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts, read_geometry
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import (
    GpuTarget,
    card_of,
    cpu_target,
    gdn_checkpoint_alignment,
    gpu_target,
)
from graph_kvcache_mcp.domain.vllm.hybrid.layout import hybrid_layout, kv_cache_tokens
from graph_kvcache_mcp.errors import ConfigError

QWEN3_NEXT = Path(__file__).parents[2] / "data" / "lmcache" / "qwen3-next-80b-a3b.config.json"
STATE = (128 * 16 * 2 + 128 * 32) * 3 * 2 + 32 * 128 * 128 * 2  # conv + SSM, bf16
PER_TOKEN = 2 * 256 * 2 * 2  # one attention layer: 2 KV heads of 256, K and V, bf16


def qwen3_next() -> ModelFacts:
    return read_geometry(json.loads(QWEN3_NEXT.read_text())).facts


def test_the_state_is_the_one_vllm_sizes_its_block_by() -> None:
    assert hybrid_layout(qwen3_next(), "gpu").state_bytes_per_layer == STATE == 1_097_728


def test_an_h100_with_vllm_0_33_aligns_the_gdn_block_to_64() -> None:
    layout = hybrid_layout(qwen3_next(), "gpu", target=gpu_target("h100", vllm_version="0.33.0"))
    # lcm(FlashAttention's 16, FlashInfer's 64) * ceil(state / (64 * per token))
    assert layout.block_size == 64 * -(-STATE // (64 * PER_TOKEN)) == 576
    assert (layout.checkpoint_alignment, layout.prefill_checkpoint_blocks) == (64, 1)
    assert layout.gpu == "h100" and layout.vllm_version == "0.33.0"


@pytest.mark.parametrize(
    "target",
    [
        gpu_target("a100", vllm_version="0.33.0"),  # Triton GDN prefill on SM80
        gpu_target("h100", vllm_version="0.32.0"),  # no checkpoint rule in 0.32
        gpu_target(None, vllm_version="0.33.0"),  # an unnamed card: A100's rule
    ],
)
def test_a100_vllm_0_32_and_an_unnamed_card_keep_544(target: GpuTarget) -> None:
    layout = hybrid_layout(qwen3_next(), "gpu", target=target)
    assert layout.block_size == 16 * -(-STATE // (16 * PER_TOKEN)) == 544
    assert (layout.checkpoint_alignment, layout.prefill_checkpoint_blocks) == (None, 0)


def test_cpu_is_unchanged_whatever_card_is_named() -> None:
    plain = hybrid_layout(qwen3_next(), "cpu")
    named = hybrid_layout(qwen3_next(), "cpu", target=gpu_target("h100"))
    assert (plain.block_size, plain.block_bytes) == (named.block_size, named.block_bytes)
    assert plain.vllm_version == cpu_target().vllm_version
    assert plain.checkpoint_alignment is named.checkpoint_alignment is None


def test_without_prefix_caching_no_checkpoint_is_kept() -> None:
    layout = hybrid_layout(
        qwen3_next(), "gpu", prefix_caching=False, target=gpu_target("h100", vllm_version="0.33")
    )
    assert (layout.block_size, layout.prefill_checkpoint_blocks) == (544, 0)


def test_the_extra_state_block_lowers_the_capacity_on_an_h100() -> None:
    facts = qwen3_next()
    memory, context = 40 * 2**30, 32768
    h100 = hybrid_layout(facts, "gpu", target=gpu_target("h100"))
    a100 = hybrid_layout(facts, "gpu", target=gpu_target("a100"))
    on_h100 = kv_cache_tokens(h100, facts, kv_cache_bytes=memory, max_model_len=context)
    on_a100 = kv_cache_tokens(a100, facts, kv_cache_bytes=memory, max_model_len=context)
    # 12 attention + 36 GDN layers: groups of 12, so 1 attention group and 3 GDN groups;
    # per request: ceil(32768 / block) attention blocks + 3 GDN groups x (2 + 1 checkpoint)
    assert (h100.attention_groups, h100.recurrent_groups) == (1, 3)
    blocks_h100 = memory // h100.block_bytes
    assert on_h100 == int(blocks_h100 / (-(-context // 576) + 3 * 3) * context)
    assert on_h100 < on_a100


def test_blackwell_needs_a_128_key_head_dim() -> None:
    b200 = gpu_target("b200", vllm_version="0.33.0")
    assert gdn_checkpoint_alignment(b200, 128) == 64
    assert gdn_checkpoint_alignment(b200, 256) is None
    assert gdn_checkpoint_alignment(gpu_target(capability="12.0"), 128) == 64
    assert gdn_checkpoint_alignment(gpu_target(capability="8.9"), 128) is None


def test_the_card_is_read_from_an_nvidia_smi_name() -> None:
    assert card_of("NVIDIA H100 80GB HBM3, 81559 MiB") == "h100"
    assert card_of("NVIDIA A100-SXM4-80GB, 81920 MiB") == "a100"
    assert card_of("NVIDIA L4, 23034 MiB") is None
    assert gpu_target("NVIDIA H200, 143771 MiB").capability == (9, 0)


@pytest.mark.parametrize("bad", [{"capability": "nine"}, {"vllm_version": "latest"}])
def test_a_malformed_capability_or_version_says_what_to_give(bad: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"give e\.g\."):
        gpu_target(**bad)


def test_diagnose_budget_reports_576_and_a_lower_capacity_for_an_h100() -> None:
    raw = json.loads(QWEN3_NEXT.read_text())
    h100 = kv_budget(raw, kv_memory_gib=40, max_model_len=32768, target=gpu_target("h100"))
    a100 = kv_budget(raw, kv_memory_gib=40, max_model_len=32768, target=gpu_target("a100"))
    assert (h100.block_size, a100.block_size) == (576, 544)
    assert h100.tokens_fit is not None and a100.tokens_fit is not None
    assert h100.tokens_fit < a100.tokens_fit
    assert any("align the block to 64" in note for note in h100.notes)
    unnamed = kv_budget(raw, platform="gpu")
    assert any("name the card" in note for note in unnamed.notes)
