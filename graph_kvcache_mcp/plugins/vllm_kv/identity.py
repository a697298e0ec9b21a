"""What an `EngineKVConnector`'s stored blocks must match, read from vLLM's config, and the
setup both sides of the connector share.

Imports vLLM (its config types) lazily; used by both sides of the connector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graph_kvcache_mcp.domain.vllm.engine_kv.device import (
    device_layout,
    kernel_block_size,
    tensor_parallel_label,
)
from graph_kvcache_mcp.domain.vllm.kv_blocks import (
    KvModelIdentity,
    unsupported_hybrid,
    unsupported_setup,
)
from graph_kvcache_mcp.plugins.vllm_kv.hybrid import HybridLayout, hybrid_layout
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass(frozen=True, slots=True)
class ConnectorSetup:
    """What both sides of one connector work with."""

    identity: KvModelIdentity
    """What a stored block value holds (a hybrid's: its attention pages)."""
    states: KvModelIdentity | None
    """A hybrid's Mamba states (None for a dense model)."""
    layout: HybridLayout | None
    """A hybrid's KV cache groups (None for a dense model)."""
    store: EngineBlockStore
    num_blocks: int = 0
    """Blocks in vLLM's KV cache (`KVCacheConfig.num_blocks`): addresses a device cache's pages."""
    async_saves: bool = False
    """Saves copy out on a side stream (a CUDA cache): requests are held until they are done."""
    tensor_parallel: int = 1
    """vLLM's tensor-parallel size: each rank stores its own heads of a block under its own key
    (`engine_kv.device.rank_key`), so a block is held only when every rank's key is."""


def model_identity(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> KvModelIdentity:
    """What the stored blocks must match, read from vLLM's config.

    A hybrid's identity describes its attention group (what a block value holds) and names
    every group's kind and geometry (`kv_groups`), so its keys are never a dense model's.

    Raises:
        ValueError: a setup this connector does not handle (a KV cache neither on the CPU nor
            on CUDA, KV cache groups other than one full-attention group or a Mamba2 hybrid in
            align mode, tensor parallelism off CUDA or for a hybrid, pipeline parallelism).
    """
    from vllm import __version__ as vllm_version

    parallel = vllm_config.parallel_config
    groups = kv_cache_config.kv_cache_groups
    cache = vllm_config.cache_config
    kv_groups = ""
    attention_group = 0
    if len(groups) > 1:
        problem = unsupported_hybrid(
            device=str(vllm_config.device_config.device_type),
            tensor_parallel=parallel.tensor_parallel_size,
            pipeline_parallel=parallel.pipeline_parallel_size,
            group_kinds=[type(group.kv_cache_spec).__name__ for group in groups],
            sliding_window=any(
                getattr(group.kv_cache_spec, "sliding_window", None) for group in groups
            ),
            mamba_cache_mode=str(cache.mamba_cache_mode),
        )
        if problem is not None:
            raise ValueError(problem)
        layout_of_groups = hybrid_layout(kv_cache_config)
        kv_groups = layout_of_groups.description
        attention_group = layout_of_groups.attention_group
    spec: Any = groups[attention_group].kv_cache_spec if groups else None
    if not kv_groups:
        problem = unsupported_setup(
            device=str(vllm_config.device_config.device_type),
            tensor_parallel=parallel.tensor_parallel_size,
            pipeline_parallel=parallel.pipeline_parallel_size,
            kv_cache_groups=len(groups),
            spec_kind=type(spec).__name__,
            sliding_window=getattr(spec, "sliding_window", None),
        )
        if problem is not None:
            raise ValueError(problem)
    model = vllm_config.model_config
    served = model.served_model_name or model.model
    served_name = served[0] if isinstance(served, list) else served
    dtype = str(spec.dtype).removeprefix("torch.")
    device = str(vllm_config.device_config.device_type)
    if device == "cpu":
        backend, kernel_block = _cpu_backend(spec.block_size)
        isa = _cpu_attention_isa(spec, cache.cache_dtype)
    else:
        backend, kernel_block = _device_backend(vllm_config, spec)
        isa = _gpu_architecture()
    layout = device_layout(
        device=device,
        backend=backend,
        kv_layout=kv_cache_config.kv_cache_layout or "LBHNC",
        kernel_block=kernel_block,
        isa=isa,
        cache_dtype=str(cache.cache_dtype),
    )
    return KvModelIdentity(
        served_model=str(served_name),
        architecture=model.architecture,
        dtype=dtype,
        num_layers=len(groups[attention_group].layer_names),
        # The spec's heads are one rank's (models divide the total by the TP size before
        # vLLM's attention layer builds it): the scheduler reads the same spec, so both agree.
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        head_size_v=spec.head_size_v or spec.head_size,
        block_size=spec.block_size,
        page_bytes=spec.page_size_bytes,
        layout=layout,
        tensor_parallel=tensor_parallel_label(
            parallel.rank % parallel.tensor_parallel_size, parallel.tensor_parallel_size
        ),
        vllm_version=vllm_version,
        kv_groups=kv_groups,
    )


def _cpu_backend(block_size: int) -> tuple[str, int]:
    """The CPU attention backend's name and the kernel block it runs `block_size` as."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return _backend_kernel(CPUAttentionBackend, block_size)
    except Exception as exc:  # private vLLM names: keep keys distinct, say what failed
        return f"unknown-{type(exc).__name__}", block_size


def _device_backend(vllm_config: VllmConfig, spec: Any) -> tuple[str, int]:
    """The attention backend vLLM selects for this config on its GPU, and its kernel block.

    The scheduler and the workers ask the same selector with the same config, so both sides
    name the same backend; a failure names itself instead (keys stay apart, never shared).
    """
    try:
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.selector import get_attn_backend

        with set_current_vllm_config(vllm_config):
            backend = get_attn_backend(
                spec.head_size,
                spec.dtype,
                str(vllm_config.cache_config.cache_dtype),
                num_heads=vllm_config.model_config.get_num_attention_heads(
                    vllm_config.parallel_config
                ),
            )
        return _backend_kernel(backend, spec.block_size)
    except Exception as exc:  # private vLLM names: keep keys distinct, say what failed
        return f"unknown-{type(exc).__name__}", spec.block_size


def _backend_kernel(backend: Any, block_size: int) -> tuple[str, int]:
    """A backend class's name and the kernel block it runs `block_size` as."""
    sizes = backend.get_supported_kernel_block_sizes()
    fixed = [size for size in sizes if isinstance(size, int)]
    bases = [int(size.base) for size in sizes if not isinstance(size, int)]
    return str(backend.get_name()), kernel_block_size(block_size, fixed, bases)


def _gpu_architecture() -> str:
    """The GPU's compute capability (`sm90`): kernels may order a page per architecture.

    Asked through vLLM's platform (NVML on CUDA), not torch.cuda: the scheduler's process of a
    multi-process vLLM has no CUDA context, and asking torch would create one there.
    """
    try:
        from vllm.platforms import current_platform

        capability = current_platform.get_device_capability()
        if capability is None:
            return "unknown-capability"
        return f"sm{capability.major}{capability.minor}"
    except Exception as exc:  # no device visible here: name the failure, keep keys distinct
        return f"unknown-{type(exc).__name__}"


def _cpu_attention_isa(spec: Any, cache_dtype: str) -> str:
    """The CPU attention kernel's ISA: it decides how K is packed inside a page."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        return str(_get_attn_isa(spec.dtype, spec.block_size, spec.head_size, cache_dtype))
    except Exception as exc:  # a private vLLM function: name the failure, keep keys distinct
        return f"unknown-{type(exc).__name__}"


def eligible(request: Request) -> bool:
    """Requests whose KV depends only on their token ids (no LoRA, images or embeddings)."""
    return not (
        request.lora_request is not None
        or request.mm_features
        or request.prompt_embeds is not None
        or request.skip_reading_prefix_cache
    )
