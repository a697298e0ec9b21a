"""A model's KV geometry, where callers import it: the facts (`facts.py`) and how they are read
from a Hugging Face `config.json` (`hf_config.py`). Pure: no I/O."""

from graph_kvcache_mcp.domain.lmcache.facts import (
    BOUNDS,
    DTYPE_BYTES,
    KERNEL_BLOCK_ALIGNMENT,
    MAX_CONFIG_DEPTH,
    MAX_LAYERS,
    MAX_SIZE,
    MAX_WINDOW,
    Count,
    GeometryInput,
    HybridFacts,
    HybridFamily,
    KvKind,
    ModelFacts,
    ModelGeometry,
)
from graph_kvcache_mcp.domain.lmcache.hf_config import (
    check_depth,
    facts_from_hf_config,
    read_geometry,
)

__all__ = [
    "BOUNDS",
    "DTYPE_BYTES",
    "KERNEL_BLOCK_ALIGNMENT",
    "MAX_CONFIG_DEPTH",
    "MAX_LAYERS",
    "MAX_SIZE",
    "MAX_WINDOW",
    "Count",
    "GeometryInput",
    "HybridFacts",
    "HybridFamily",
    "KvKind",
    "ModelFacts",
    "ModelGeometry",
    "check_depth",
    "facts_from_hf_config",
    "read_geometry",
]
