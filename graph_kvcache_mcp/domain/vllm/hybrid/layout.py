"""How vLLM lays out a hybrid model's KV cache: groups, page, block, padding, capacity. Pure.

The rules are vLLM 0.32's (`Platform._align_hybrid_block_size`,
`_get_kv_cache_groups_uniform_page_size`, `get_max_concurrency_for_kv_cache_config`):

- The attention page must hold at least one recurrent state: the block is the smallest multiple
  of max(the backend's smallest kernel block, the requested block) whose attention page is at
  least the state page. vLLM logs "Setting attention block size to N tokens" when it raises the
  block, then "Padding mamba page size by X%" so every page has the same bytes.
- Layers are grouped by kind, each group the size of the smaller kind (the larger when it is
  under 1.5 times the smaller): a Mamba2 hybrid of 2 + 2 layers has 2 groups, one of 4 Mamba +
  2 attention layers has 3.
- One block costs a group's layers × the page; a request at max_model_len takes
  ceil(len / block) blocks per attention group and 1 per recurrent group (2, plus a prefill
  checkpoint for Mamba2, in align mode). vLLM logs `num_blocks / blocks_per_request ×
  max_model_len` as "CPU KV cache size: N tokens".
- vLLM 0.33 on Hopper (and Blackwell for a 128 key head dim) adds the gated-delta-net
  checkpoint rule of `gpu_rules`: the block a multiple of 64, one more state block per request.
- On CPU (vLLM's CPU build targets AVX-512 BF16), the SSM state is stored in float32 except a
  gated delta net whose config asks for a 16-bit one.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.lmcache.facts import ModelFacts
from graph_kvcache_mcp.domain.versions import VLLM_GPU_VERSION
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import (
    GDN_CHECKPOINT_BLOCKS,
    GpuTarget,
    cpu_target,
    gdn_checkpoint_alignment,
)
from graph_kvcache_mcp.errors import ConfigError

PlatformKind = Literal["cpu", "gpu"]
MambaCacheMode = Literal["none", "align"]

KERNEL_BLOCK = {"cpu": 32, "gpu": 16}
"""Smallest kernel block of the attention backend vLLM picks (CPU_ATTN; FlashAttention)."""
DEFAULT_BLOCK = {"cpu": 128, "gpu": 16}
"""vLLM's block when none is requested (CPU platform default; CacheConfig's)."""
PREFILL_CHECKPOINT_BLOCKS = {"mamba2": 1, "gdn": 0, "mamba1": 0}
"""Extra state blocks a request holds in align mode (Mamba2 exports a mid-step checkpoint)."""


class PredictedHybridLayout(BaseModel):
    """The KV cache vLLM builds for a hybrid model on one platform."""

    model_config = ConfigDict(frozen=True)

    platform: PlatformKind
    requested_block_size: int
    block_size: int = Field(description="The block vLLM will use (its own log's figure).")
    block_raised: bool = Field(description="vLLM logs 'Setting attention block size to N'.")
    kv_cache_groups: int
    attention_groups: int
    recurrent_groups: int
    layers_per_group: int
    state_bytes_per_layer: int = Field(description="Conv + SSM state as stored there.")
    ssm_dtype: str
    page_bytes: int = Field(description="Bytes of one page, every group.")
    padding_pct: float = Field(description="vLLM's 'Padding mamba page size by X%'.")
    block_bytes: int = Field(description="Bytes one block takes from the KV memory.")
    mamba_cache_mode: MambaCacheMode
    vllm_version: str
    """The vLLM release whose rules were applied."""
    gpu: str | None = None
    """The card those rules were applied for (None: CPU, or a GPU not named)."""
    checkpoint_alignment: int | None = None
    """Token grid of align-mode prefill checkpoints (a GDN on FlashInfer), or None."""
    prefill_checkpoint_blocks: int = 0
    """Extra state blocks a request keeps for prefill checkpoints (align mode)."""


def hybrid_layout(
    facts: ModelFacts,
    platform: PlatformKind,
    *,
    block_size: int | None = None,
    prefix_caching: bool = True,
    tp: int = 1,
    target: GpuTarget | None = None,
) -> PredictedHybridLayout:
    """The layout vLLM will build for `facts` given the requested `block_size`, by the rules of
    `target`'s vLLM and card (default: the CPU pin on CPU, the GPU pin on an unnamed GPU).

    Raises:
        ConfigError: the model is not a hybrid of a family known here (its state is unknown).
    """
    hybrid = facts.hybrid
    state_bytes = None if hybrid is None else hybrid.state_bytes(ssm_dtype(facts, platform))
    if hybrid is None or state_bytes is None:
        raise ConfigError(
            f"{facts.name} is not a hybrid of a family known here: its recurrent state size "
            "is unknown, so vLLM's block cannot be predicted"
        )
    state = max(1, state_bytes // tp)
    per_token = facts.attention_bytes_per_token_layer(tp)
    if target is None:
        target = cpu_target() if platform == "cpu" else GpuTarget(vllm_version=VLLM_GPU_VERSION)
    if platform == "cpu":
        target = target.model_copy(update={"capability": None, "gpu": None})
    alignment = None
    if prefix_caching and hybrid.family == "gdn":
        alignment = gdn_checkpoint_alignment(target, hybrid.key_head_dim)
    requested = block_size or DEFAULT_BLOCK[platform]
    kernel = max(KERNEL_BLOCK[platform], requested)
    if alignment is not None:
        kernel = math.lcm(kernel, alignment)
    needed = kernel * math.ceil(state / (kernel * per_token))
    needed = KERNEL_BLOCK[platform] * math.ceil(needed / KERNEL_BLOCK[platform])
    block = max(requested, needed)
    page = block * per_token
    attention, recurrent = facts.attention_layers, hybrid.linear_layers
    group = min(attention, recurrent)
    if max(attention, recurrent) < group * 1.5:
        group = max(attention, recurrent)
    return PredictedHybridLayout(
        platform=platform,
        requested_block_size=requested,
        block_size=block,
        block_raised=block > requested,
        kv_cache_groups=math.ceil(attention / group) + math.ceil(recurrent / group),
        attention_groups=math.ceil(attention / group),
        recurrent_groups=math.ceil(recurrent / group),
        layers_per_group=group,
        state_bytes_per_layer=state,
        ssm_dtype=ssm_dtype(facts, platform),
        page_bytes=page,
        padding_pct=round(100 * (page - state) / state, 2),
        block_bytes=group * page,
        mamba_cache_mode="align" if prefix_caching else "none",
        vllm_version=target.vllm_version,
        gpu=target.gpu,
        checkpoint_alignment=alignment,
        prefill_checkpoint_blocks=(
            0
            if not prefix_caching
            else GDN_CHECKPOINT_BLOCKS
            if alignment
            else PREFILL_CHECKPOINT_BLOCKS.get(hybrid.family, 0)
        ),
    )


def ssm_dtype(facts: ModelFacts, platform: PlatformKind) -> str:
    """The dtype vLLM stores the SSM state in on `platform`."""
    hybrid = facts.hybrid
    given = (hybrid.ssm_dtype if hybrid else None) or facts.kv_dtype
    if platform != "cpu" or given == "float32":
        return given
    sixteen_bit = given in ("bfloat16", "float16")
    if hybrid is not None and hybrid.family == "gdn" and hybrid.ssm_dtype_explicit and sixteen_bit:
        return given
    return "float32"


def kv_cache_tokens(
    layout: PredictedHybridLayout, facts: ModelFacts, *, kv_cache_bytes: int, max_model_len: int
) -> int:
    """vLLM's "KV cache size: N tokens" for this layout, memory and context length."""
    blocks = kv_cache_bytes // layout.block_bytes
    per_state = 1
    if layout.mamba_cache_mode == "align" and facts.hybrid is not None:
        per_state = 2 + layout.prefill_checkpoint_blocks
    per_request = (
        layout.attention_groups * math.ceil(max_model_len / layout.block_size)
        + layout.recurrent_groups * per_state
    )
    return int(blocks / per_request * max_model_len)


def gpu_rule_note(layout: PredictedHybridLayout, facts: ModelFacts) -> str | None:
    """What a gated delta net's GPU layout assumed about the card, or None (CPU, another
    family): on vLLM 0.33 its block differs between Hopper/Blackwell and A100."""
    if layout.platform != "gpu" or facts.hybrid is None or facts.hybrid.family != "gdn":
        return None
    if layout.checkpoint_alignment is not None:
        return (
            f"gated delta net on {layout.gpu or 'this GPU'} with vLLM {layout.vllm_version}: "
            f"FlashInfer prefill checkpoints align the block to {layout.checkpoint_alignment} "
            "and keep one more state block per request (`--gdn-prefill-backend triton` would not)"
        )
    if layout.gpu is None:
        return (
            "gated delta net on an unnamed GPU: laid out as on an A100 (Triton prefill); with "
            "vLLM 0.33 on an H100/H200 (or B200) the block is a multiple of 64 and each request "
            "keeps one more state block: name the card (gpu h100|h200|a100|b200)"
        )
    return None
