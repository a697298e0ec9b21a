"""A model's KV geometry: KV kind, bytes per token, sliding-window and recurrent layers, hybrid
block size. Pure: no I/O. One implementation serves the LMCache config generator and `diagnose
budget`.

`ModelFacts` is read from a Hugging Face `config.json` by `hf_config.read_geometry`, or written
out by hand. The hybrid (Mamba / gated-delta-net) attention block size is an estimate of vLLM's
rule — attention page >= recurrent-state page, in multiples of 16 tokens — and says so; vLLM logs
the real value ("Setting attention block size to N tokens"), which callers pass back as
`mamba_block_size`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.errors import ConfigError

KvKind = Literal["dense", "mla", "hybrid", "compressed"]
HybridFamily = Literal["gdn", "mamba2", "mamba1", "unknown"]
"""The recurrent mixer: gated delta net, Mamba2, Mamba1, or not known here."""

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
    model_family: str | None = Field(None, description="e.g. GraniteMoeHybrid, NemotronH.")
    conv_bytes: int | None = Field(None, description="Conv state of one layer, model dtype.")
    ssm_elements: int | None = Field(None, description="SSM state elements of one layer.")
    ssm_dtype: str | None = Field(None, description="SSM state dtype from the config or vLLM.")
    ssm_dtype_explicit: bool = Field(
        False, description="The config (or vLLM for the family) fixes the SSM dtype."
    )
    chunk_size: int | None = Field(None, description="The Mamba2 scan chunk, in tokens.")
    chunk_key: str | None = Field(None, description="The config key of the chunk size.")
    key_head_dim: int | None = None
    """A gated delta net's linear_key_head_dim: it picks the GDN prefill kernel on Blackwell."""

    def state_bytes(self, ssm_dtype: str | None = None) -> int | None:
        """One layer's state with the SSM part stored as `ssm_dtype` (default: the config's)."""
        if self.conv_bytes is None or self.ssm_elements is None:
            return self.state_bytes_per_layer
        dtype = ssm_dtype or self.ssm_dtype or "bfloat16"
        return self.conv_bytes + self.ssm_elements * DTYPE_BYTES[dtype]


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
