"""The recurrent side of a hybrid model, read the way vLLM reads each family. Pure: no I/O.

vLLM serves three kinds of recurrent mixer beside attention: Mamba2 (GraniteMoeHybrid, NemotronH,
FalconH1, Zamba2, Bamba, Mamba2), the gated delta net (Qwen3-Next, Qwen3.5) and Mamba1 (Jamba,
Mamba). Each family names its sizes with keys of its own; `FAMILIES` lists them as vLLM's model
classes read them (`get_mamba_state_shape_from_config`). A key the state needs and the config
lacks is a `ConfigError` naming it: a hybrid's state is never sized from a default.

Layer kinds come from `layer_types` / `layers_block_type` (transformers 5 writes
"linear_attention" / "full_attention", older configs "mamba" / "attention"),
`hybrid_override_pattern` ("M" Mamba, "*" attention), `attn_layer_indices`,
`attn_layer_period`/`attn_layer_offset` or `full_attention_interval`. NemotronH's config has no
`num_hidden_layers`: its pattern counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from graph_kvcache_mcp.domain.lmcache.facts import (
    DTYPE_BYTES,
    MAX_LAYERS,
    HybridFacts,
    HybridFamily,
)
from graph_kvcache_mcp.errors import ConfigError

Integer = Callable[[str], int]
"""Reads one bounded positive integer field of the config (the caller's `_int`)."""

_MAMBA_KINDS = frozenset({"mamba", "linear_attention", "m", "hybrid"})
_ATTENTION_KINDS = frozenset({"attention", "full_attention", "*", "hybrid"})
_PATTERN_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


@dataclass(frozen=True)
class _Family:
    """How one family's config names its recurrent sizes (None: computed another way)."""

    label: str
    mixer: HybridFamily
    heads: str | None = None
    head_dim: str | None = None
    state: str | None = None
    groups: str | None = None
    conv: str | None = None
    expand: str | None = None
    chunk_key: str | None = None
    ssm_dtype_key: str | None = None
    ssm_dtype_default: str | None = None
    attention_everywhere: bool = False


def _granite_keys(label: str, *, attention_everywhere: bool = False) -> _Family:
    """Granite 4.0-H, Bamba and FalconH1 name their Mamba2 sizes alike."""
    return _Family(
        label,
        "mamba2",
        heads="mamba_n_heads",
        head_dim="mamba_d_head",
        state="mamba_d_state",
        groups="mamba_n_groups",
        conv="mamba_d_conv",
        expand="mamba_expand",
        chunk_key="mamba_chunk_size",
        attention_everywhere=attention_everywhere,
    )


FAMILIES: dict[str, _Family] = {
    "granitemoehybrid": _granite_keys("GraniteMoeHybrid"),
    "bamba": _granite_keys("Bamba"),
    "falcon_h1": _granite_keys("FalconH1", attention_everywhere=True),
    "nemotron_h": _Family(
        "NemotronH",
        "mamba2",
        heads="mamba_num_heads",
        head_dim="mamba_head_dim",
        state="ssm_state_size",
        groups="n_groups",
        conv="conv_kernel",
        chunk_key="chunk_size",
        # vLLM keeps NemotronH's SSM state in float32 unless the config says otherwise.
        ssm_dtype_key="mamba_ssm_cache_dtype",
        ssm_dtype_default="float32",
    ),
    "zamba2": _Family(
        "Zamba2",
        "mamba2",
        heads="n_mamba_heads",
        head_dim="mamba_headdim",
        state="mamba_d_state",
        groups="mamba_ngroups",
        conv="mamba_d_conv",
        expand="mamba_expand",
        chunk_key="chunk_size",
    ),
    "mamba2": _Family(
        "Mamba2",
        "mamba2",
        heads="num_heads",
        head_dim="head_dim",
        state="state_size",
        groups="n_groups",
        conv="conv_kernel",
        expand="expand",
        chunk_key="chunk_size",
    ),
    "qwen3_next": _Family("Qwen3-Next", "gdn"),
    "qwen3_5": _Family("Qwen3.5", "gdn", ssm_dtype_key="mamba_ssm_dtype"),
    "qwen3_5_text": _Family("Qwen3.5", "gdn", ssm_dtype_key="mamba_ssm_dtype"),
    "qwen3_5_moe": _Family("Qwen3.5", "gdn", ssm_dtype_key="mamba_ssm_dtype"),
    "qwen3_5_moe_text": _Family("Qwen3.5", "gdn", ssm_dtype_key="mamba_ssm_dtype"),
    "jamba": _Family(
        "Jamba", "mamba1", state="mamba_d_state", conv="mamba_d_conv", expand="mamba_expand"
    ),
    "mamba": _Family("Mamba", "mamba1", state="state_size", conv="conv_kernel"),
    "falcon_mamba": _Family("FalconMamba", "mamba1", state="state_size", conv="conv_kernel"),
}
"""Keyed by `model_type`; the keys are those vLLM's model class reads for the state shape."""


@dataclass(frozen=True)
class LayerKinds:
    """How many layers hold attention KV and how many a recurrent state (a FalconH1 or Zamba2
    hybrid layer holds both)."""

    layers: int
    attention: int
    recurrent: int


def family_of(text: Mapping[str, Any]) -> _Family | None:
    """The family a config belongs to, from its `model_type` (or its GDN keys)."""
    family = FAMILIES.get(str(text.get("model_type") or ""))
    if family is None and "linear_num_value_heads" in text:
        return FAMILIES["qwen3_next"]
    return family


def declares_recurrent_layers(text: Mapping[str, Any]) -> bool:
    """Whether a model's config keeps a recurrent state: a family of `FAMILIES`, or a family
    added to vLLM after this table whose layer list or pattern names recurrent layers."""
    if family_of(text) is not None:
        return True
    for key in ("layer_types", "layers_block_type"):
        values = text.get(key)
        if isinstance(values, list) and any(str(v).lower() in _MAMBA_KINDS for v in values):
            return True
    pattern = text.get("hybrid_override_pattern")
    return isinstance(pattern, str) and "M" in pattern


def hidden_layer_count(text: Mapping[str, Any]) -> int | None:
    """`num_hidden_layers`, else the length of NemotronH's layer list or pattern."""
    if "num_hidden_layers" in text:
        return None
    for key in ("layers_block_type", "hybrid_override_pattern"):
        value = text.get(key)
        if isinstance(value, (str, list)) and 0 < len(value) <= MAX_LAYERS:
            return len(value)
    return None


def layer_kinds(
    text: Mapping[str, Any], family: _Family, layers: int, integer: Integer
) -> LayerKinds:
    """Count attention and recurrent layers from the family's layer description.

    Raises:
        ConfigError: no layer description, or one whose length is not the layer count.
    """
    if family.attention_everywhere:
        return LayerKinds(layers, layers, layers)
    kinds = _listed_kinds(text, layers)
    if kinds is None:
        kinds = _computed_kinds(text, family, layers, integer)
    attention = sum(k in _ATTENTION_KINDS for k in kinds)
    recurrent = sum(k in _MAMBA_KINDS for k in kinds)
    if family.mixer == "gdn" or family.label in {"Mamba2", "Mamba", "FalconMamba"}:
        recurrent = layers - attention if family.mixer == "gdn" else layers
    return LayerKinds(layers, attention, recurrent)


def _listed_kinds(text: Mapping[str, Any], layers: int) -> list[str] | None:
    for key in ("layer_types", "layers_block_type"):
        value = text.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"config.json {key} must be a list of strings, one per layer")
        if len(value) != layers:
            raise ConfigError(
                f"config.json {key} has {len(value)} entries for {layers} layers: one per layer"
            )
        return [k.lower() for k in value]
    pattern = text.get("hybrid_override_pattern")
    if pattern is None:
        return None
    if not isinstance(pattern, str) or len(pattern) != layers:
        raise ConfigError(
            f"config.json hybrid_override_pattern must be a string of {layers} letters "
            "(M Mamba, * attention, - MLP, E MoE), one per layer"
        )
    return [_PATTERN_KINDS.get(letter, "other") if letter != "M" else "mamba" for letter in pattern]


def _computed_kinds(
    text: Mapping[str, Any], family: _Family, layers: int, integer: Integer
) -> list[str]:
    """Layer kinds of configs that give a rule instead of a list."""
    indices = text.get("attn_layer_indices")
    if isinstance(indices, list):  # Bamba
        return ["attention" if i in indices else "mamba" for i in range(layers)]
    if family.label in {"Mamba2", "Mamba", "FalconMamba"}:
        return ["mamba"] * layers
    if family.mixer == "gdn":
        interval = integer("full_attention_interval")
        return ["attention" if (i + 1) % interval == 0 else "mamba" for i in range(layers)]
    if family.label == "Jamba":
        period, offset = integer("attn_layer_period"), _non_negative(text, "attn_layer_offset")
        return ["attention" if i % period == offset else "mamba" for i in range(layers)]
    raise ConfigError(
        f"config.json of a {family.label} model has no layer_types, layers_block_type or "
        "hybrid_override_pattern: it does not say which layers are Mamba"
    )


def _non_negative(text: Mapping[str, Any], key: str) -> int:
    value = text.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_LAYERS:
        raise ConfigError(f"config.json has no valid {key!r}, which the layer layout needs")
    return value


def hybrid_facts(
    text: Mapping[str, Any],
    family: _Family,
    kinds: LayerKinds,
    integer: Integer,
    dtype: str,
) -> HybridFacts:
    """The recurrent facts of one family: state element counts and the dtypes vLLM stores.

    Raises:
        ConfigError: a key the state shape needs is missing or malformed; names it.
    """
    conv_elements, ssm_elements = _state_elements(text, family, integer)
    ssm_dtype = dtype
    explicit = False
    if family.ssm_dtype_key is not None:
        given = text.get(family.ssm_dtype_key) or family.ssm_dtype_default
        if given is not None:
            ssm_dtype, explicit = _dtype_name(family.ssm_dtype_key, given), True
    conv_bytes = conv_elements * DTYPE_BYTES[dtype]
    ssm_bytes = ssm_elements * DTYPE_BYTES[ssm_dtype]
    chunk = None
    if family.chunk_key is not None and text.get(family.chunk_key) is not None:
        chunk = integer(family.chunk_key)
    return HybridFacts(
        family=family.mixer,
        linear_layers=kinds.recurrent,
        state_bytes_per_layer=conv_bytes + ssm_bytes,
        model_family=family.label,
        conv_bytes=conv_bytes,
        ssm_elements=ssm_elements,
        ssm_dtype=ssm_dtype,
        ssm_dtype_explicit=explicit,
        chunk_size=chunk,
        chunk_key=family.chunk_key,
        key_head_dim=integer("linear_key_head_dim") if family.mixer == "gdn" else None,
    )


def _state_elements(text: Mapping[str, Any], family: _Family, integer: Integer) -> tuple[int, int]:
    """(conv, ssm) elements of one layer's state, one TP rank (vLLM's shape calculator)."""
    if family.mixer == "gdn":
        k_heads, v_heads = integer("linear_num_key_heads"), integer("linear_num_value_heads")
        k_dim, v_dim = integer("linear_key_head_dim"), integer("linear_value_head_dim")
        kernel = integer("linear_conv_kernel_dim")
        return (k_dim * k_heads * 2 + v_dim * v_heads) * (kernel - 1), v_heads * v_dim * k_dim
    assert family.state is not None and family.conv is not None
    state, conv = integer(family.state), integer(family.conv)
    if family.mixer == "mamba1":
        inner = _intermediate(text, family, integer)
        return inner * (conv - 1), inner * state
    assert family.heads is not None and family.head_dim is not None and family.groups is not None
    heads, head_dim, groups = (
        integer(family.heads),
        integer(family.head_dim),
        integer(family.groups),
    )
    inner = heads * head_dim if family.expand is None else _intermediate(text, family, integer)
    return (inner + 2 * groups * state) * (conv - 1), heads * head_dim * state


def _intermediate(text: Mapping[str, Any], family: _Family, integer: Integer) -> int:
    """The Mamba inner width: FalconH1's `mamba_d_ssm`, Mamba's `intermediate_size`, else
    expand × hidden_size."""
    if family.label == "FalconH1" and text.get("mamba_d_ssm") is not None:
        return integer("mamba_d_ssm")
    if family.expand is None:
        return integer("intermediate_size")
    expand = text.get(family.expand)
    if isinstance(expand, bool) or not isinstance(expand, (int, float)) or not 0 < expand <= 64:
        raise ConfigError(
            f"config.json has no valid {family.expand!r}, which the Mamba state needs"
        )
    return int(expand * integer("hidden_size"))


def _dtype_name(key: str, value: Any) -> str:
    name = str(value).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ConfigError(
            f"config.json {key} is {str(value)[:40]!r}; use one of {', '.join(sorted(DTYPE_BYTES))}"
        )
    return name
