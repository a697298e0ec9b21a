"""What vLLM's prefix cache can reuse on a hybrid model (mamba or gated-delta-net + attention).

Pure: no I/O. The minimum the fleet and the miss diagnosis need: whether a served model is a
hybrid, and the hit a hybrid serves right after one request.

In `--mamba-cache-mode align` vLLM keeps a request's mamba state only where its prefill ended, at
its last full block before its last token (`floor((tokens - 1) / block) * block`, measured: a
224-token prompt of block 32 kept it at 192), not at every block. A later prompt resumes
only from a position where every group has a block: the attention blocks of the whole shared
prefix, and a kept state. So a prompt sharing part of a cached one gets nothing from it unless
some earlier request ended exactly there; the way to make a prefix reusable is to end a request
on it (a warm-up call with just the shared head).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graph_kvcache_mcp.domain.fleet.index import cacheable_tokens
from graph_kvcache_mcp.domain.lmcache.hybrid_families import declares_recurrent_layers
from graph_kvcache_mcp.domain.vllm.hybrid.launch import model_text

MAMBA_LABELS = ("mamba_cache_mode", "mamba_block_size")
"""`vllm:cache_config_info` labels that say a served model keeps mamba state."""
_NO_MAMBA = frozenset({"", "none", "None", "null"})


def is_hybrid_cache(labels: Mapping[str, str]) -> bool | None:
    """Whether `vllm:cache_config_info`'s labels say the model keeps mamba state.

    vLLM exports `mamba_block_size` only once a model has mamba layers; a dense model's is
    absent or empty. None when the labels carry neither field (a vLLM too old to say).
    """
    if not any(name in labels for name in MAMBA_LABELS):
        return None
    return labels.get("mamba_block_size", "") not in _NO_MAMBA


def is_hybrid_config(config: Mapping[str, Any]) -> bool:
    """Whether a model's `config.json` declares layers that keep a recurrent state (mamba,
    gated delta net), read through the family table the launch rules use."""
    return declares_recurrent_layers(model_text(config))


def keeps_state_at_prefill_end_only(labels: Mapping[str, str]) -> bool:
    """Whether a served hybrid reuses only where a request's prefill ended: any mamba cache
    mode but "all" (older vLLMs' mode that keeps a state at every block, as a dense model)."""
    return bool(is_hybrid_cache(labels)) and labels.get("mamba_cache_mode") != "all"


def state_position(prompt_tokens: int, block_size: int) -> int:
    """Where vLLM keeps the mamba state of a request of `prompt_tokens`: its last full block
    before its last token, the most a repeat of it can reuse."""
    return cacheable_tokens(prompt_tokens, block_size)


def hybrid_cached_tokens(
    first_tokens: int, common: int, second_tokens: int, block_size: int
) -> int:
    """Prompt tokens a hybrid serves from cache for the second request, right after the first:
    the first's kept state, when the second shares all of it and it is within the whole blocks
    before the second's last token; otherwise nothing."""
    kept = state_position(first_tokens, block_size)
    if kept == 0 or kept > common or kept > cacheable_tokens(second_tokens, block_size):
        return 0
    return kept
