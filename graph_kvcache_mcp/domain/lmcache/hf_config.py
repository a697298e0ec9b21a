"""Reading a Hugging Face `config.json` into a model's KV geometry. Pure: no I/O.

`read_geometry` reads a parsed config the way vLLM sizes its KV cache and records where each
number came from (`GeometryInput`); every integer is bounded, and a config that is nested too
deep, inconsistent or missing a field the sizing needs is a `ConfigError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from graph_kvcache_mcp.domain.lmcache.facts import (
    BOUNDS,
    DTYPE_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_SIZE,
    GeometryInput,
    HybridFacts,
    ModelFacts,
    ModelGeometry,
)
from graph_kvcache_mcp.domain.lmcache.hybrid_families import (
    family_of,
    hidden_layer_count,
    hybrid_facts,
    layer_kinds,
)
from graph_kvcache_mcp.errors import ConfigError, describe_validation


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
    """The steps in order: which model, its dtype and layers, then its KV kind's facts."""
    text: Mapping[str, Any] = raw
    if isinstance(raw.get("text_config"), Mapping):
        text = {**raw, **raw["text_config"]}
    read = _Reader(text)
    common = _common_facts(raw, text, read, name)
    model_type = str(text.get("model_type") or raw.get("model_type") or "")
    counted = hidden_layer_count(text)
    if counted is not None:  # NemotronH: no num_hidden_layers, one pattern entry per layer
        read.record("num_hidden_layers", counted, "length of the layer pattern")
        layers = counted
    else:
        layers = read.integer("num_hidden_layers")
    family = family_of(text)
    layer_types = [] if family is not None else _layer_types(text, layers)
    if family is not None:
        return ModelGeometry(
            facts=_hybrid_model(read, common, family, layers), inputs=tuple(read.inputs)
        )
    facts, sliding_layers = _facts_by_kind(read, common, model_type, layers, layer_types)
    return ModelGeometry(
        facts=facts, sliding_window_layers=sliding_layers, inputs=tuple(read.inputs)
    )


def _common_facts(
    raw: Mapping[str, Any], text: Mapping[str, Any], read: _Reader, name: str | None
) -> dict[str, Any]:
    """What every KV kind shares: the model's name and architecture, KV dtype, vision."""
    architectures = raw.get("architectures") or []
    architecture = str(architectures[0]) if architectures else None
    model_name = name or str(raw.get("_name_or_path") or architecture or "")
    if not model_name:
        raise ConfigError("config.json names no model: pass the model id (e.g. Qwen/Qwen3-8B)")
    dtype = str(text.get("torch_dtype") or text.get("dtype") or raw.get("torch_dtype") or "")
    dtype = dtype.removeprefix("torch.")
    read.record("kv_dtype", dtype or "bfloat16", "config.json" if dtype else "default")
    return {
        "name": model_name,
        "architecture": architecture,
        "kv_dtype": dtype or "bfloat16",
        "vision": _has_vision(raw, architecture),
    }


def _facts_by_kind(
    read: _Reader,
    common: dict[str, Any],
    model_type: str,
    layers: int,
    layer_types: Sequence[str],
) -> tuple[ModelFacts, int]:
    """The facts and sliding-window layer count, by the first kind that fits: compressed, MLA,
    hybrid, else dense (with or without a window)."""
    if _is_compressed(read.config, model_type, layer_types):
        return _compressed(read, common, layers), 0
    if read.config.get("kv_lora_rank"):
        return _mla(read, common, layers), 0
    kv_heads, head_dim = _attention_heads(read)
    if _looks_hybrid(read.config, layer_types):
        hybrid = HybridFacts(family="unknown", linear_layers=0, state_bytes_per_layer=None)
        return ModelFacts(
            kind="hybrid",
            attention_layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            hybrid=hybrid,
            **common,
        ), 0
    window, sliding_layers = _sliding_window(read, model_type, layers, layer_types)
    return ModelFacts(
        kind="dense",
        attention_layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        sliding_window=window,
        **common,
    ), sliding_layers


def _compressed(read: _Reader, common: dict[str, Any], layers: int) -> ModelFacts:
    return ModelFacts(
        kind="compressed",
        attention_layers=layers,
        kv_heads=read.integer("num_key_value_heads", 1),
        head_dim=read.integer("head_dim", 512),
        **common,
    )


def _mla(read: _Reader, common: dict[str, Any], layers: int) -> ModelFacts:
    latent = read.integer("kv_lora_rank") + read.integer("qk_rope_head_dim", 64)
    return ModelFacts(
        kind="mla",
        attention_layers=layers,
        kv_heads=1,
        head_dim=latent,
        mla_kv_dim=latent,
        **common,
    )


def _attention_heads(read: _Reader) -> tuple[int, int]:
    """KV heads and head dim of grouped-query attention (head_dim, else hidden / heads)."""
    text = read.config
    heads = read.integer("num_attention_heads")
    kv_heads = read.integer("num_key_value_heads", heads)
    if kv_heads > heads or heads % kv_heads:
        raise ConfigError(
            f"config.json num_key_value_heads ({kv_heads}) must divide num_attention_heads "
            f"({heads}): each KV head serves a whole group of attention heads"
        )
    if text.get("head_dim") is not None:
        return kv_heads, read.integer("head_dim")
    hidden = _int(text, "hidden_size")
    if hidden % heads:
        raise ConfigError(
            f"config.json hidden_size ({hidden}) is not a multiple of num_attention_heads "
            f"({heads}), and there is no head_dim"
        )
    read.record("head_dim", hidden // heads, "hidden_size / num_attention_heads")
    return kv_heads, hidden // heads


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


def _looks_hybrid(text: Mapping[str, Any], layer_types: Sequence[str]) -> bool:
    """A recurrent model of a family not known here: its state size stays unknown."""
    recurrent_keys = (
        "mamba_d_state",
        "ssm_state_size",
        "attn_layer_period",
        "linear_num_key_heads",
    )
    return any(k in text for k in recurrent_keys) or any(
        t in ("mamba", "linear_attention") for t in layer_types
    )


def _hybrid_model(read: _Reader, common: dict[str, Any], family: Any, layers: int) -> ModelFacts:
    """A hybrid of a family vLLM serves: its layer kinds, attention heads and state.

    Raises:
        ConfigError: a key the state or the layer layout needs is missing; names it.
    """
    kinds = layer_kinds(read.config, family, layers, read.integer)
    hybrid = hybrid_facts(read.config, family, kinds, read.integer, _dtype(common["kv_dtype"]))
    read.record("recurrent_layers", kinds.recurrent, f"{hybrid.model_family} layer layout")
    if hybrid.state_bytes_per_layer is not None:
        read.record("state_bytes_per_layer", hybrid.state_bytes_per_layer, "conv + ssm state")
    if kinds.recurrent == 0:
        raise ConfigError(
            f"config.json's layer layout gives this {hybrid.model_family} model no Mamba layer"
        )
    if kinds.attention == 0:
        raise ConfigError(
            f"config.json describes an attention-free {hybrid.model_family} model: it has no "
            "attention KV to budget or to cache by prefix"
        )
    if "head_dim" not in read.config and "attention_head_dim" in read.config:
        # Zamba2's config maps head_dim to attention_head_dim (its attention is 2 × hidden wide)
        read.config = {**read.config, "head_dim": read.config["attention_head_dim"]}
    kv_heads, head_dim = _attention_heads(read)
    return ModelFacts(
        kind="hybrid",
        attention_layers=kinds.attention,
        kv_heads=kv_heads,
        head_dim=head_dim,
        hybrid=hybrid,
        **common,
    )


def _dtype(name: str) -> str:
    if name not in DTYPE_BYTES:
        raise ConfigError(f"config.json dtype {name[:40]!r} is not a dtype vLLM stores state in")
    return name


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
