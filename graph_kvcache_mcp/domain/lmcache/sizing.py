"""How big an LMCache chunk is: the hybrid block size it must be a multiple of, and the engine's
value cap it must stay under. Pure: no I/O."""

from __future__ import annotations

import math
from typing import Literal

from graph_kvcache_mcp.domain.engine.limits import MAX_VALUE_BYTES
from graph_kvcache_mcp.domain.lmcache.choices import LmcacheChoices
from graph_kvcache_mcp.domain.lmcache.model import KERNEL_BLOCK_ALIGNMENT, ModelFacts
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import GpuTarget, cpu_target, gpu_target
from graph_kvcache_mcp.domain.vllm.hybrid.launch import cpu_mp_limit
from graph_kvcache_mcp.domain.vllm.hybrid.layout import PlatformKind, gpu_rule_note, hybrid_layout
from graph_kvcache_mcp.errors import ConfigError

ENGINE_VALUE_CAP_BYTES = MAX_VALUE_BYTES
"""Largest block both engine backends store (the durable one frames values with 9 bytes)."""
INPROCESS_HEADER_BYTES = 28
"""LMCache's RemoteMetadata header our in-process connector stores in front of each chunk."""
DEFAULT_CHUNK_TOKENS = 256


def block_size(
    facts: ModelFacts, choices: LmcacheChoices, warnings: list[str]
) -> tuple[int | None, Literal["given", "estimated"] | None]:
    if facts.kind != "hybrid":
        return None, None
    if choices.mamba_block_size is not None:
        return choices.mamba_block_size, "given"
    if facts.hybrid is None or facts.hybrid.state_bytes_per_layer is None:
        raise ConfigError(
            f"{facts.name} is a hybrid whose recurrent-state size is unknown here: start vLLM "
            "once, read 'Setting attention block size to N tokens' from its log, and pass "
            "mamba_block_size=N"
        )
    platform: PlatformKind = "cpu" if choices.cpu else "gpu"
    layout = hybrid_layout(
        facts,
        platform,
        block_size=choices.vllm_block_size,
        tp=choices.tensor_parallel_size,
        target=target_of(choices),
    )
    estimate = layout.block_size
    warnings.append(
        f"hybrid block size {estimate} is an estimate of vLLM {layout.vllm_version}'s rule on "
        f"{(layout.gpu or platform).upper()} ({layout.kv_cache_groups} KV cache groups); "
        "confirm it against vLLM's log line 'Setting attention block size to N tokens' and "
        "pass mamba_block_size=N if it differs"
    )
    if (card := gpu_rule_note(layout, facts)) is not None:
        warnings.append(card)
    # The plan itself holds on a GPU; on a CPU vLLM the MP connector cannot take the groups.
    on_cpu = layout if choices.cpu else hybrid_layout(facts, "cpu", tp=choices.tensor_parallel_size)
    if choices.mode != "inprocess_plugin" and on_cpu.kv_cache_groups > 1:
        label = facts.hybrid.model_family or "hybrid"
        warnings.append(cpu_mp_limit(label, on_cpu.kv_cache_groups))
    return estimate, "estimated"


def target_of(choices: LmcacheChoices) -> GpuTarget:
    """The vLLM release and card the choices name (the pins, and no card, by default)."""
    if choices.cpu:
        target = cpu_target()
        version = choices.vllm_version or target.vllm_version
        return target.model_copy(update={"vllm_version": version})
    named = choices.gpu
    capability = named if named is not None and named[0].isdigit() else None
    card = None if capability is not None else named
    return gpu_target(card, vllm_version=choices.vllm_version, capability=capability)


def chunk_size(
    facts: ModelFacts, choices: LmcacheChoices, block: int | None, warnings: list[str]
) -> int:
    unit = block or choices.vllm_block_size or KERNEL_BLOCK_ALIGNMENT
    if block and choices.vllm_block_size:
        unit = math.lcm(block, choices.vllm_block_size)
    tp = choices.tensor_parallel_size
    if choices.chunk_size is not None:
        if choices.chunk_size % unit:
            lower = max(unit, choices.chunk_size // unit * unit)
            raise ConfigError(
                f"chunk_size {choices.chunk_size} is not a multiple of "
                + (f"the hybrid block size {unit}" if block else f"vLLM's block size {unit}")
                + f": use {lower} or {lower + unit}"
            )
        chunk = choices.chunk_size
    else:
        chunk = unit * max(1, -(-DEFAULT_CHUNK_TOKENS // unit))
    cap = ENGINE_VALUE_CAP_BYTES - INPROCESS_HEADER_BYTES
    size = facts.chunk_bytes(chunk, tp, block)
    if size <= cap or facts.kind == "compressed":
        return chunk
    fitting = chunk
    while fitting > unit and facts.chunk_bytes(fitting, tp, block) > cap:
        fitting -= unit
    if facts.chunk_bytes(fitting, tp, block) > cap:
        warnings.append(
            f"even a {unit}-token chunk is {facts.chunk_bytes(unit, tp, block):,} bytes, over "
            f"the engine's {ENGINE_VALUE_CAP_BYTES:,}-byte value cap: raise "
            "tensor_parallel_size or keep this model's KV out of the engine"
        )
        return chunk
    if choices.chunk_size is not None:
        warnings.append(
            f"chunk_size {chunk} makes {size:,}-byte chunks, over the engine's "
            f"{ENGINE_VALUE_CAP_BYTES:,}-byte value cap; the engine would refuse every one: "
            f"use chunk_size {fitting} or less"
        )
        return chunk
    warnings.append(
        f"a {chunk}-token chunk would be {size:,} bytes, over the engine's "
        f"{ENGINE_VALUE_CAP_BYTES:,}-byte value cap: chunk size lowered to {fitting}"
    )
    return fitting
