"""Model identities for tests and benchmarks of the vLLM KV blocks (bf16 K and V per page)."""

from __future__ import annotations

from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity


def kv_identity(
    *,
    layers: int = 2,
    kv_heads: int = 2,
    head_size: int = 64,
    block_size: int = 4,
    served_model: str = "tiny-llama",
) -> KvModelIdentity:
    """The identity of a bf16 Llama on CPU vLLM 0.32 with this geometry."""
    return KvModelIdentity(
        served_model=served_model,
        architecture="LlamaForCausalLM",
        dtype="bfloat16",
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_size=head_size,
        head_size_v=head_size,
        block_size=block_size,
        page_bytes=kv_heads * block_size * 2 * head_size * 2,
        layout="cpu:LBHNC:vec:auto",
        vllm_version="0.32.0",
    )
