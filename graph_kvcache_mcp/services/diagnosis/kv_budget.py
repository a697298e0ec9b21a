"""`diagnose budget`: the KV budget of a model given as a config.json path or its parsed object.

Shared by the `diagnose_budget` tool and the `diagnose budget` CLI so both return the same model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.connectors.files.hf_config import read_hf_config
from graph_kvcache_mcp.connectors.vllm.platform import detect_platform
from graph_kvcache_mcp.domain.diagnosis.kv_budget import KvBudget, kv_budget
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import gpu_target
from graph_kvcache_mcp.domain.vllm.hybrid.layout import PlatformKind


def budget_for(
    hf_config: str | Path | Mapping[str, Any],
    *,
    kv_dtype: str | None = None,
    kv_memory_gib: float | None = None,
    chunk_size: int | None = None,
    block_size: int | None = None,
    platform: PlatformKind | None = None,
    max_model_len: int | None = None,
    prefix_caching: bool = True,
    gpu: str | None = None,
    vllm_version: str | None = None,
) -> KvBudget:
    """The budget of the model `hf_config` describes (a local path, or the parsed JSON object);
    a hybrid's laid out as vLLM does on `platform` (default: this machine's), on the card `gpu`
    names (a100, h100, h200, b200 or a compute capability; default: the one nvidia-smi names)
    by the rules of `vllm_version` (default: the pin of that platform).

    Raises:
        ConfigError: the file is missing or not a config.json, or a field or option is wrong.
    """
    inline = isinstance(hf_config, Mapping)
    config = hf_config if isinstance(hf_config, Mapping) else read_hf_config(hf_config)
    if platform is None or (platform == "gpu" and gpu is None):
        detected = detect_platform()
        platform = platform or detected.kind
        if gpu is None and detected.gpus:
            gpu = detected.gpus[0]
    capability = gpu if gpu is not None and gpu[:1].isdigit() else None
    target = gpu_target(
        None if capability else gpu, vllm_version=vllm_version, capability=capability
    )
    budget = kv_budget(
        config,
        kv_dtype=kv_dtype,
        kv_memory_gib=kv_memory_gib,
        chunk_size=chunk_size,
        block_size=block_size,
        platform=platform,
        max_model_len=max_model_len,
        prefix_caching=prefix_caching,
        target=target if platform == "gpu" else None,
    )
    if not inline:
        return budget
    # A value read from an object the caller passed did not come from a config.json file.
    inputs = [
        item.model_copy(update={"source": INLINE_SOURCE}) if item.source == "config.json" else item
        for item in budget.inputs
    ]
    return budget.model_copy(update={"inputs": inputs})


INLINE_SOURCE = "hf_config object"
