"""How much KV a model needs: bytes per token, tokens that fit, chunk bytes. Pure: no I/O.

Built on the model geometry the LMCache config generator uses (`lmcache_model.read_geometry`), so
both size the KV cache the same way. Full-attention layers grow with the context; sliding-window
layers stop at their window and recurrent (Mamba / gated-delta-net) state is a fixed size per
sequence, so both are reported apart from `bytes_per_token`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from graph_kvcache_mcp.domain.lmcache.config import ENGINE_VALUE_CAP_BYTES
from graph_kvcache_mcp.domain.lmcache.model import (
    GeometryInput,
    HybridFamily,
    KvKind,
    ModelFacts,
    ModelGeometry,
    read_geometry,
)
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import GpuTarget
from graph_kvcache_mcp.domain.vllm.hybrid.layout import (
    PlatformKind,
    PredictedHybridLayout,
    gpu_rule_note,
    hybrid_layout,
    kv_cache_tokens,
)
from graph_kvcache_mcp.errors import ConfigError

GIB = 2**30


class SlidingWindowBudget(BaseModel):
    """Layers that keep only the last `window_tokens` tokens: bounded per sequence."""

    model_config = ConfigDict(frozen=True)

    layers: int
    window_tokens: int
    bytes_per_token: int = Field(description="KV bytes one token adds in these layers.")
    bytes_per_sequence: int = Field(description="Most these layers hold for one sequence.")


class RecurrentStateBudget(BaseModel):
    """Mamba / gated-delta-net layers of a hybrid: a fixed state per sequence."""

    model_config = ConfigDict(frozen=True)

    family: HybridFamily
    layers: int
    bytes_per_sequence: int | None = Field(
        description="The state in the model's SSM dtype (ssm_dtype); None when unknown."
    )
    ssm_dtype: str | None = Field(None, description="The dtype bytes_per_sequence counts in.")
    vllm_bytes_per_sequence: int | None = Field(
        None,
        description="The state as vLLM stores it on the hybrid layout's platform (its SSM dtype "
        "may differ: float32 on CPU): what its KV cache holds per sequence.",
    )
    vllm_ssm_dtype: str | None = Field(None, description="The dtype vLLM stores it in.")


class HybridBudget(BaseModel):
    """How vLLM lays out a hybrid's KV cache on one platform, and what fits (its own figures)."""

    model_config = ConfigDict(frozen=True)

    layout: PredictedHybridLayout
    max_model_len: int | None = Field(None, description="Context the token count is for.")
    kv_cache_tokens: int | None = Field(
        None, description="vLLM's 'KV cache size: N tokens' for kv_memory_gib."
    )


class ChunkBudget(BaseModel):
    """One LMCache chunk of `chunk_tokens` tokens, as the engine would store it."""

    model_config = ConfigDict(frozen=True)

    chunk_tokens: int
    chunk_bytes: int
    engine_value_cap_bytes: int = ENGINE_VALUE_CAP_BYTES
    over_engine_value_cap: bool


class KvBudget(BaseModel):
    """The KV budget of one model (tool and CLI output)."""

    model_config = ConfigDict(frozen=True)

    model: str
    kind: KvKind
    kv_dtype: str
    dtype_bytes: int
    full_attention_layers: int
    bytes_per_token: int | None = Field(
        description="KV bytes per token in full-attention layers (None: not modelled)."
    )
    sliding_window: SlidingWindowBudget | None = None
    recurrent_state: RecurrentStateBudget | None = None
    hybrid: HybridBudget | None = Field(None, description="vLLM's layout of a hybrid's cache.")
    kv_memory_gib: float | None = None
    tokens_fit: int | None = Field(None, description="Tokens whose KV fits in kv_memory_gib.")
    block_size: int | None = None
    block_bytes: int | None = Field(None, description="KV bytes of one block of block_size.")
    chunk: ChunkBudget | None = None
    inputs: list[GeometryInput] = Field(description="Every number used, with its source.")
    notes: list[str] = Field(default_factory=list)


MAX_KV_MEMORY_GIB = 1 << 20
"""Largest KV memory accepted (1 PiB): beyond it a number is a typo, and floats lose tokens."""
MAX_TOKENS_PER_UNIT = 1 << 20
"""Largest chunk_size or block_size accepted, in tokens."""
KvMemoryGib = Annotated[float, Field(gt=0, le=MAX_KV_MEMORY_GIB, allow_inf_nan=False)]
UnitTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_PER_UNIT)]
"""A chunk or block size in tokens. These bounds are the only declaration: the diagnose_budget
tool, `diagnose budget` and `kv_budget` itself use them."""


def kv_budget(
    config: Mapping[str, Any],
    *,
    kv_dtype: str | None = None,
    kv_memory_gib: float | None = None,
    chunk_size: int | None = None,
    block_size: int | None = None,
    platform: PlatformKind = "gpu",
    max_model_len: int | None = None,
    prefix_caching: bool = True,
    target: GpuTarget | None = None,
) -> KvBudget:
    """The budget of the model a parsed HF `config.json` describes; a hybrid's as vLLM lays it
    out on `platform` (prefix caching on: align mode) by `target`'s vLLM and card rules, for
    `max_model_len` (default: the config's max_position_embeddings, as vLLM).

    Raises:
        ConfigError: the config lacks a field the geometry needs, an unknown dtype, or a
            non-positive size; names it.
    """
    for name, value, declared, ceiling in (
        ("kv_memory_gib", kv_memory_gib, _KV_MEMORY_CHECK, MAX_KV_MEMORY_GIB),
        ("chunk_size", chunk_size, _UNIT_CHECK, MAX_TOKENS_PER_UNIT),
        ("block_size", block_size, _UNIT_CHECK, MAX_TOKENS_PER_UNIT),
    ):
        if value is not None and not _fits(declared, value):
            raise ConfigError(f"{name} is {value}: give a positive number of at most {ceiling:,}")
    named = config.get("_name_or_path") or config.get("architectures")
    geometry = read_geometry(config, name=None if named else "unnamed model")
    inputs = list(geometry.inputs)
    if kv_dtype is not None and kv_dtype != "auto":
        geometry = geometry.model_copy(
            update={"facts": geometry.facts.model_copy(update={"kv_dtype": kv_dtype})}
        )
        inputs = [i for i in inputs if i.name != "kv_dtype"]
        inputs.append(GeometryInput(name="kv_dtype", value=kv_dtype, source="given"))
    budget = _budget(geometry, inputs, kv_memory_gib, chunk_size, block_size)
    if geometry.facts.hybrid is None or geometry.facts.hybrid.state_bytes_per_layer is None:
        return budget
    context = max_model_len or _max_positions(config)
    layout = hybrid_layout(
        geometry.facts,
        platform,
        block_size=budget.block_size,
        prefix_caching=prefix_caching,
        target=target,
    )
    return _with_hybrid(budget, geometry.facts, layout, context)


def _max_positions(config: Mapping[str, Any]) -> int | None:
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, Mapping) else config
    value = merged.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _with_hybrid(
    budget: KvBudget,
    facts: ModelFacts,
    layout: PredictedHybridLayout,
    max_model_len: int | None,
) -> KvBudget:
    """The budget with vLLM's hybrid layout: its block, groups and padded pages, and the
    tokens it reports for the memory (attention bytes alone count 5-20% too many)."""
    platform = layout.platform
    tokens = None
    if budget.kv_memory_gib is not None and max_model_len is not None:
        memory = int(budget.kv_memory_gib * GIB)
        tokens = kv_cache_tokens(layout, facts, kv_cache_bytes=memory, max_model_len=max_model_len)
    notes = [
        *budget.notes,
        f"hybrid on {platform.upper()}: vLLM will use block {layout.block_size}"
        + (f" (raised from {layout.requested_block_size})" if layout.block_raised else "")
        + f", {layout.kv_cache_groups} KV cache groups, pages of {layout.page_bytes:,} bytes "
        f"(Mamba page padded {layout.padding_pct}%)",
    ]
    if (card := gpu_rule_note(layout, facts)) is not None:
        notes.append(card)
    if budget.kv_memory_gib is not None and max_model_len is None:
        notes.append("no max_position_embeddings: give max_model_len for vLLM's token count")
    recurrent = budget.recurrent_state
    if recurrent is not None:
        stored = layout.state_bytes_per_layer * recurrent.layers
        recurrent = recurrent.model_copy(
            update={"vllm_bytes_per_sequence": stored, "vllm_ssm_dtype": layout.ssm_dtype}
        )
        notes.append(
            f"recurrent state: vLLM stores it in {layout.ssm_dtype} on {platform.upper()}, "
            f"{stored:,} bytes per sequence (vllm_bytes_per_sequence, the figure its cache "
            f"holds); bytes_per_sequence counts it in {recurrent.ssm_dtype}"
        )
    return budget.model_copy(
        update={
            "recurrent_state": recurrent,
            "hybrid": HybridBudget(
                layout=layout, max_model_len=max_model_len, kv_cache_tokens=tokens
            ),
            "tokens_fit": tokens if tokens is not None else budget.tokens_fit,
            "block_size": layout.block_size,
            "block_bytes": layout.block_bytes,
            "notes": notes,
        }
    )


def _budget(
    geometry: ModelGeometry,
    inputs: list[GeometryInput],
    kv_memory_gib: float | None,
    chunk_size: int | None,
    block_size: int | None,
) -> KvBudget:
    """The steps: bytes per token of the full-attention layers, the windowed and recurrent
    layers beside them, what fits in the memory given, then one block and one chunk."""
    facts = geometry.facts
    notes: list[str] = []
    full_layers = facts.attention_layers - geometry.sliding_window_layers
    per_layer = facts.attention_bytes_per_token_layer(1)
    bytes_per_token: int | None = full_layers * per_layer
    if facts.kind == "compressed":
        bytes_per_token = None
        notes.append(
            "compressed sparse attention (DeepSeek-V4 style) is not modelled: read vLLM's "
            "startup log for its KV cache size"
        )
    sliding = _sliding_budget(geometry, per_layer)
    # Every token counts in the full-attention layers; a model with none (every layer windowed)
    # pays the windowed bytes for each token inside the window.
    fit_per_token = bytes_per_token or (sliding.bytes_per_token if sliding else None)
    if sliding is not None and not bytes_per_token:
        notes.append("every attention layer is windowed: tokens_fit counts windowed bytes")
    tokens_fit = None
    if kv_memory_gib is not None and fit_per_token:
        tokens_fit = int(kv_memory_gib * GIB) // fit_per_token
    chunk = _chunk_budget(facts, chunk_size, block_size)
    if chunk is not None and chunk.over_engine_value_cap:
        notes.append(
            f"a {chunk.chunk_tokens}-token chunk is {chunk.chunk_bytes:,} bytes, over the "
            f"engine's {ENGINE_VALUE_CAP_BYTES:,}-byte value cap: use a smaller chunk_size"
        )
    return KvBudget(
        model=facts.name,
        kind=facts.kind,
        kv_dtype=facts.kv_dtype,
        dtype_bytes=facts.dtype_bytes(),
        full_attention_layers=full_layers,
        bytes_per_token=bytes_per_token,
        sliding_window=sliding,
        recurrent_state=_recurrent_budget(facts),
        kv_memory_gib=kv_memory_gib,
        tokens_fit=tokens_fit,
        block_size=block_size,
        block_bytes=block_size * fit_per_token if block_size and fit_per_token else None,
        chunk=chunk,
        inputs=inputs,
        notes=notes,
    )


def _sliding_budget(geometry: ModelGeometry, per_layer: int) -> SlidingWindowBudget | None:
    facts = geometry.facts
    if not geometry.sliding_window_layers or not facts.sliding_window:
        return None
    per_token = geometry.sliding_window_layers * per_layer
    return SlidingWindowBudget(
        layers=geometry.sliding_window_layers,
        window_tokens=facts.sliding_window,
        bytes_per_token=per_token,
        bytes_per_sequence=per_token * facts.sliding_window,
    )


def _recurrent_budget(facts: ModelFacts) -> RecurrentStateBudget | None:
    if facts.hybrid is None:
        return None
    state = facts.hybrid.state_bytes_per_layer
    return RecurrentStateBudget(
        family=facts.hybrid.family,
        layers=facts.hybrid.linear_layers,
        bytes_per_sequence=None if state is None else state * facts.hybrid.linear_layers,
        ssm_dtype=facts.hybrid.ssm_dtype or facts.kv_dtype,
    )


def _chunk_budget(
    facts: ModelFacts, chunk_size: int | None, block_size: int | None
) -> ChunkBudget | None:
    if chunk_size is None or facts.kind == "compressed":
        return None
    size = facts.chunk_bytes(chunk_size, 1, block_size)
    return ChunkBudget(
        chunk_tokens=chunk_size,
        chunk_bytes=size,
        over_engine_value_cap=size > ENGINE_VALUE_CAP_BYTES,
    )


_KV_MEMORY_CHECK: TypeAdapter[float] = TypeAdapter(KvMemoryGib)
_UNIT_CHECK: TypeAdapter[int] = TypeAdapter(UnitTokens)
"""Built once: a validator costs far more to build than to run."""


def _fits(declared: TypeAdapter[Any], value: float) -> bool:
    try:
        declared.validate_python(value)
    except ValidationError:
        return False
    return True
