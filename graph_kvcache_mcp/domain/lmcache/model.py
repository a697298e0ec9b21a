"""A model's KV geometry: KV kind, bytes per token, sliding-window and recurrent layers, hybrid
block size. Pure: no I/O. One implementation serves the LMCache config generator and `diagnose
budget`.

`read_geometry` reads a Hugging Face `config.json` (already parsed) the way vLLM sizes its KV cache
and records where each number came from; `ModelFacts` can also be written out by hand. The hybrid
(Mamba / gated-delta-net) attention block size is an estimate of vLLM's rule — attention page >=
recurrent-state page, in multiples of 16 tokens — and says so; vLLM logs the real value ("Setting
attention block size to N tokens"), which callers pass back as `mamba_block_size`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graph_kvcache_mcp.errors import ConfigError, describe_validation

KvKind = Literal["dense", "mla", "hybrid", "compressed"]
HybridFamily = Literal["gdn", "mamba2", "unknown"]

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e4m3fn": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}
KERNEL_BLOCK_ALIGNMENT = 16
"""Smallest kernel block of vLLM's common attention backends; hybrid blocks are multiples of it."""

MAX_CONFIG_DEPTH = 32
"""Deepest nesting a config.json may have (real ones nest 3 or 4 levels)."""
MAX_LAYERS = 4096
MAX_SIZE = 1 << 20
"""Largest head count, head or hidden dimension, state or kernel size accepted from a config
(real models stay far below: 128 heads, 16k hidden). A bigger number is a broken config."""
MAX_WINDOW = 1 << 24
BOUNDS: dict[str, int] = {"num_hidden_layers": MAX_LAYERS, "sliding_window": MAX_WINDOW}
"""Fields with a ceiling of their own; every other integer field is bounded by `MAX_SIZE`."""


class HybridFacts(BaseModel):
    """The recurrent (linear-attention / Mamba) side of a hybrid model."""

    model_config = ConfigDict(frozen=True)

    family: HybridFamily
    linear_layers: int = Field(ge=0)
    state_bytes_per_layer: int | None = Field(
        None, description="Recurrent state of one layer (conv + SSM), one TP rank; None = unknown."
    )


Count = Annotated[int, Field(ge=1)]
"""A layer, head or width count: the model facts a caller may give instead of a config.json."""


class ModelFacts(BaseModel):
    """The architecture facts the LMCache plan depends on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="Model id as vLLM serves it, e.g. Qwen/Qwen3-8B.")
    architecture: str | None = None
    kind: KvKind = "dense"
    attention_layers: Count = Field(description="Layers that hold attention KV.")
    kv_heads: Count = 1
    head_dim: Count = 128
    kv_dtype: str = "bfloat16"
    mla_kv_dim: int | None = Field(None, description="MLA latent width (kv_lora_rank + rope dim).")
    hybrid: HybridFacts | None = None
    vision: bool = False
    sliding_window: int | None = None

    def dtype_bytes(self) -> int:
        try:
            return DTYPE_BYTES[self.kv_dtype]
        except KeyError:
            raise ConfigError(
                f"unknown KV dtype {self.kv_dtype!r}; use one of {', '.join(sorted(DTYPE_BYTES))}"
            ) from None

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one tensor-parallel rank holds (replicated when heads < ranks)."""
        return max(1, self.kv_heads // tp)

    def attention_bytes_per_token_layer(self, tp: int) -> int:
        """KV bytes one token adds in one attention layer on one rank."""
        if self.kind == "mla":
            return (self.mla_kv_dim or 0) * self.dtype_bytes()
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * self.dtype_bytes()

    def kv_bytes_per_token(self, tp: int) -> int:
        return self.attention_layers * self.attention_bytes_per_token_layer(tp)

    def estimated_block_size(self, tp: int) -> int | None:
        """vLLM's attention block size for a hybrid, estimated (None when the state is unknown)."""
        if self.hybrid is None or self.hybrid.state_bytes_per_layer is None:
            return None
        unit = KERNEL_BLOCK_ALIGNMENT * self.attention_bytes_per_token_layer(tp)
        state = _per_rank(self.hybrid.state_bytes_per_layer, tp)
        return KERNEL_BLOCK_ALIGNMENT * max(1, math.ceil(state / unit))

    def chunk_bytes(self, chunk_tokens: int, tp: int, block_size: int | None = None) -> int:
        """Estimated bytes of one LMCache chunk object on one rank (attention KV, plus one
        block-sized recurrent-state page per linear layer for hybrids)."""
        per_layer = self.attention_bytes_per_token_layer(tp)
        total = self.attention_layers * chunk_tokens * per_layer
        if self.hybrid is not None and block_size:
            total += self.hybrid.linear_layers * block_size * per_layer
        return total


def _per_rank(state_bytes: int, tp: int) -> int:
    return max(1, state_bytes // tp)


class GeometryInput(BaseModel):
    """One number the geometry was computed from, and where it came from."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: int | str
    source: str = Field(
        description="config.json (hf_config object when passed inline), default, given, or how it "
        "was computed."
    )


class ModelGeometry(BaseModel):
    """What a config.json says about the KV cache: the facts, the sliding-window layers among the
    attention layers, and the inputs used."""

    model_config = ConfigDict(frozen=True)

    facts: ModelFacts
    sliding_window_layers: int = Field(0, ge=0, description="Attention layers with a window.")
    inputs: tuple[GeometryInput, ...] = ()


class _Reader:
    """Reads integer fields of a config, recording each value and whether it was defaulted."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.inputs: list[GeometryInput] = []

    def integer(self, key: str, default: int | None = None) -> int:
        value = _int(self.config, key, default)
        self.record(key, value, "config.json" if key in self.config else "default")
        return value

    def record(self, name: str, value: int | str, source: str) -> None:
        if all(known.name != name for known in self.inputs):
            self.inputs.append(GeometryInput(name=name, value=value, source=source))


def facts_from_hf_config(raw: Mapping[str, Any], *, name: str | None = None) -> ModelFacts:
    """Read the facts from a parsed HF `config.json` (multimodal configs: their `text_config`).

    Raises:
        ConfigError: a field the plan needs is missing or malformed; names it.
    """
    return read_geometry(raw, name=name).facts


def read_geometry(raw: Mapping[str, Any], *, name: str | None = None) -> ModelGeometry:
    """The KV geometry of a parsed HF `config.json`, with the inputs it was read from.

    Raises:
        ConfigError: a field the geometry needs is missing or malformed; names it.
    """
    check_depth(raw)
    try:
        return _read_geometry(raw, name)
    except ValidationError as exc:  # a combination the fields allow one by one, but not together
        raise ConfigError(
            f"config.json describes an impossible model ({describe_validation(exc, whole='model')})"
        ) from None


def check_depth(value: Any, *, limit: int = MAX_CONFIG_DEPTH) -> None:
    """Refuse JSON nested deeper than `limit` (checked without recursion).

    Raises:
        ConfigError: says how deep is allowed.
    """
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = (
            item.values() if isinstance(item, Mapping) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, (Mapping, list)):
                if depth + 1 > limit:
                    raise ConfigError(
                        f"config.json nests deeper than {limit} levels: not a model config"
                    )
                pending.append((child, depth + 1))


def _read_geometry(raw: Mapping[str, Any], name: str | None) -> ModelGeometry:
    text: Mapping[str, Any] = raw
    if isinstance(raw.get("text_config"), Mapping):
        text = {**raw, **raw["text_config"]}
    architectures = raw.get("architectures") or []
    architecture = str(architectures[0]) if architectures else None
    model_name = name or str(raw.get("_name_or_path") or architecture or "")
    if not model_name:
        raise ConfigError("config.json names no model: pass the model id (e.g. Qwen/Qwen3-8B)")
    model_type = str(text.get("model_type") or raw.get("model_type") or "")
    read = _Reader(text)
    dtype = str(text.get("torch_dtype") or text.get("dtype") or raw.get("torch_dtype") or "")
    dtype = dtype.removeprefix("torch.")
    read.record("kv_dtype", dtype or "bfloat16", "config.json" if dtype else "default")
    dtype = dtype or "bfloat16"
    vision = _has_vision(raw, architecture)
    layers = read.integer("num_hidden_layers")
    layer_types = _layer_types(text, layers)
    common: dict[str, Any] = {
        "name": model_name,
        "architecture": architecture,
        "kv_dtype": dtype,
        "vision": vision,
    }

    def geometry(facts: ModelFacts, sliding_layers: int = 0) -> ModelGeometry:
        return ModelGeometry(
            facts=facts, sliding_window_layers=sliding_layers, inputs=tuple(read.inputs)
        )

    if _is_compressed(text, model_type, layer_types):
        return geometry(
            ModelFacts(
                kind="compressed",
                attention_layers=layers,
                kv_heads=read.integer("num_key_value_heads", 1),
                head_dim=read.integer("head_dim", 512),
                **common,
            )
        )
    if text.get("kv_lora_rank"):
        latent = read.integer("kv_lora_rank") + read.integer("qk_rope_head_dim", 64)
        return geometry(
            ModelFacts(
                kind="mla",
                attention_layers=layers,
                kv_heads=1,
                head_dim=latent,
                mla_kv_dim=latent,
                **common,
            )
        )

    heads = read.integer("num_attention_heads")
    kv_heads = read.integer("num_key_value_heads", heads)
    if kv_heads > heads or heads % kv_heads:
        raise ConfigError(
            f"config.json num_key_value_heads ({kv_heads}) must divide num_attention_heads "
            f"({heads}): each KV head serves a whole group of attention heads"
        )
    if text.get("head_dim") is not None:
        head_dim = read.integer("head_dim")
    else:
        hidden = _int(text, "hidden_size")
        if hidden % heads:
            raise ConfigError(
                f"config.json hidden_size ({hidden}) is not a multiple of num_attention_heads "
                f"({heads}), and there is no head_dim"
            )
        head_dim = hidden // heads
        read.record("head_dim", head_dim, "hidden_size / num_attention_heads")
    hybrid = _hybrid(read, layers, layer_types, dtype)
    if hybrid is not None:
        return geometry(
            ModelFacts(
                kind="hybrid",
                attention_layers=layers - hybrid.linear_layers,
                kv_heads=kv_heads,
                head_dim=head_dim,
                hybrid=hybrid,
                **common,
            )
        )
    window, sliding_layers = _sliding_window(read, model_type, layers, layer_types)
    return geometry(
        ModelFacts(
            kind="dense",
            attention_layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            sliding_window=window,
            **common,
        ),
        sliding_layers,
    )


def _sliding_window(
    read: _Reader, model_type: str, layers: int, layer_types: Sequence[str]
) -> tuple[int | None, int]:
    """The window and how many layers use it: `layer_types`, else `sliding_window_pattern`
    (every Nth layer is global), else Gemma 2's alternation, else all layers."""
    window = read.config.get("sliding_window")
    if read.config.get("use_sliding_window") is False:  # Qwen2-style: a window that is off
        return None, 0
    if window is None or window == 0 or isinstance(window, bool):
        return None, 0
    window = _int(read.config, "sliding_window")
    read.record("sliding_window", window, "config.json")
    if layer_types:
        sliding = sum(t == "sliding_attention" for t in layer_types)
        read.record("sliding_window_layers", sliding, "config.json layer_types")
        return window, sliding
    pattern = read.config.get("sliding_window_pattern")
    if model_type == "gemma2" and pattern is None:
        pattern = 2
    if pattern is not None:
        pattern = _int({"sliding_window_pattern": pattern}, "sliding_window_pattern")
        read.record("sliding_window_pattern", pattern, "config.json")
        sliding = sum(1 for i in range(layers) if (i + 1) % pattern)
        return window, sliding
    read.record("sliding_window_layers", layers, "all layers (no layer_types or pattern)")
    return window, layers


def _is_compressed(text: Mapping[str, Any], model_type: str, layer_types: Sequence[str]) -> bool:
    # DeepSeek-V4-style compressed sparse attention: LMCache's MP connector cannot store it yet.
    return (
        model_type.startswith("deepseek_v4")
        or any("compress" in t for t in layer_types)
        or any(k in text for k in ("compress_rates", "compress_ratios", "compress_rate_csa"))
    )


def _has_vision(raw: Mapping[str, Any], architecture: str | None) -> bool:
    if any(k in raw for k in ("vision_config", "vision_tower", "mm_vision_tower")):
        return True
    if isinstance(raw.get("vision_n_layers"), int) and raw["vision_n_layers"] > 0:
        return True
    arch = (architecture or "").lower()
    return any(tag in arch for tag in ("vl", "vision", "conditionalgeneration"))


def _hybrid(
    read: _Reader, layers: int, layer_types: Sequence[str], dtype: str
) -> HybridFacts | None:
    text = read.config
    if "linear_num_value_heads" in text or any(t == "linear_attention" for t in layer_types):
        return _gdn(read, layers, layer_types, dtype)
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) != layers:
        raise ConfigError(
            f"config.json hybrid_override_pattern has {len(pattern)} entries for "
            f"num_hidden_layers {layers}: one per layer"
        )
    if isinstance(pattern, str) and "M" in pattern:  # NemotronH: M = Mamba2, * = attention
        return _mamba2(
            read, pattern.count("M"), _NEMOTRON_H_KEYS, dtype=dtype, ssm_default="float32"
        )
    if any(t == "mamba" for t in layer_types):  # Granite 4.0-H style
        linear = sum(t == "mamba" for t in layer_types)
        return _mamba2(read, linear, _GRANITE_H_KEYS, dtype=dtype, ssm_default=dtype)
    if any(k in text for k in ("mamba_d_state", "ssm_state_size", "attn_layer_period")):
        return HybridFacts(family="unknown", linear_layers=0, state_bytes_per_layer=None)
    return None


def _gdn(read: _Reader, layers: int, layer_types: Sequence[str], dtype: str) -> HybridFacts:
    text = read.config
    if layer_types:
        linear = sum(t == "linear_attention" for t in layer_types)
    else:
        interval = read.integer("full_attention_interval", 4)
        linear = sum(1 for i in range(layers) if (i + 1) % interval)
    k_heads = read.integer("linear_num_key_heads", 16)
    v_heads = read.integer("linear_num_value_heads", 32)
    k_dim = read.integer("linear_key_head_dim", 128)
    v_dim = read.integer("linear_value_head_dim", 128)
    kernel = read.integer("linear_conv_kernel_dim", 4)
    ssm_dtype = str(text.get("mamba_ssm_dtype") or dtype)
    conv = (k_dim * k_heads * 2 + v_dim * v_heads) * (kernel - 1) * _bytes(dtype)
    temporal = v_heads * k_dim * v_dim * _bytes(ssm_dtype)
    return HybridFacts(family="gdn", linear_layers=linear, state_bytes_per_layer=conv + temporal)


_NEMOTRON_H_KEYS = (
    "mamba_num_heads",
    "mamba_head_dim",
    "ssm_state_size",
    "n_groups",
    "conv_kernel",
)
_GRANITE_H_KEYS = (
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_d_state",
    "mamba_n_groups",
    "mamba_d_conv",
)
"""The config keys of each family's Mamba2 sizes: heads, head dim, state, groups, conv."""


def _mamba2(
    read: _Reader,
    linear_layers: int,
    keys: tuple[str, str, str, str, str],
    *,
    dtype: str,
    ssm_default: str,
) -> HybridFacts:
    heads_key, head_dim_key, state_key, groups_key, conv_key = keys
    heads = read.integer(heads_key)
    head_dim = read.integer(head_dim_key)
    state = read.integer(state_key)
    groups = read.integer(groups_key, 1)
    conv = read.integer(conv_key, 4)
    ssm_dtype = str(read.config.get("mamba_ssm_cache_dtype") or ssm_default)
    conv_bytes = (heads * head_dim + 2 * groups * state) * (conv - 1) * _bytes(dtype)
    ssm_bytes = heads * head_dim * state * _bytes(ssm_dtype)
    return HybridFacts(
        family="mamba2", linear_layers=linear_layers, state_bytes_per_layer=conv_bytes + ssm_bytes
    )


def _bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)


def _layer_types(text: Mapping[str, Any], layers: int) -> list[str]:
    types = text.get("layer_types")
    if types is None:
        return []
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ConfigError("config.json layer_types must be a list of strings, one per layer")
    if types and len(types) != layers:
        raise ConfigError(
            f"config.json layer_types has {len(types)} entries for num_hidden_layers {layers}: "
            "one per layer"
        )
    return types


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """A positive integer field, bounded (`BOUNDS`, else `MAX_SIZE`).

    Raises:
        ConfigError: missing, not an integer, not positive, or too large; names the field.
    """
    value = config.get(key, default)
    if value is None:
        raise ConfigError(f"config.json has no {key!r}, which sizing the KV cache needs")
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value)[:80]
        raise ConfigError(f"config.json {key!r} is {shown}, not an integer")
    ceiling = BOUNDS.get(key, MAX_SIZE)
    if not 1 <= value <= ceiling:
        shown = str(value) if len(str(value)) <= 40 else f"a {len(str(value))}-digit number"
        raise ConfigError(
            f"config.json {key!r} is {shown}: it must be a positive integer of at most {ceiling:,}"
        )
    return value
