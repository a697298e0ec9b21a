"""Which GPU and which vLLM a hybrid's layout is predicted for, and the gated-delta-net
prefill-checkpoint rule vLLM 0.33 added on Hopper and Blackwell. Pure: no I/O.

Read in vLLM 0.33.0's source:
- `qwen_gdn_linear_attn.py`, the GDN prefill backend choice: FlashInfer on CUDA capability 9.0
  (Hopper: H100, H200), and on the 10.x and 12.x families (Blackwell) when the model's
  `linear_key_head_dim` is 128 and the CUDA runtime is 13 or newer; Triton everywhere else
  (A100, CPU, `--gdn-prefill-backend triton`).
- With prefix caching on (vLLM derives align mode from it), a FlashInfer GDN layer declares a
  prefill-checkpoint alignment of 64 (`gdn_attn.FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`) and one
  prefill-checkpoint block (`MambaSpec.num_prefill_checkpoint_blocks = 1`).
- `Platform._align_hybrid_block_size` then makes the block a multiple of lcm(kernel block, 64),
  and `MambaSpec.max_memory_usage_bytes` counts 2 + 1 state blocks per request.
vLLM 0.32 has neither rule: its GDN exports no checkpoint, on every card.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.versions import VLLM_CPU_VERSION, VLLM_GPU_VERSION
from graph_kvcache_mcp.errors import ConfigError

GpuName = Literal["a100", "h100", "h200", "b200"]
GPU_CAPABILITY: dict[GpuName, tuple[int, int]] = {
    "a100": (8, 0),
    "h100": (9, 0),
    "h200": (9, 0),
    "b200": (10, 0),
}
"""CUDA compute capability of each card the `--gpu` flag names."""
BudgetPlatform = Literal["cpu", "gpu", "a100", "h100", "h200", "b200"]
"""The diagnose_budget tool's `platform`: CPU, an unnamed GPU, or a card (its rules)."""
VERSION_PATTERN = r"\d+\.\d+(\.\d+)?"
GpuChoice = Annotated[
    str,
    Field(
        pattern=r"^(a100|h100|h200|b200|\d{1,2}\.\d)$",
        description="vLLM's GPU, or its compute capability (default: detected).",
    ),
]
"""How a caller names the card: the one declaration the tools, CLI flags and choices use."""
VllmVersion = Annotated[
    str,
    Field(
        pattern=rf"^{VERSION_PATTERN}$",
        description="The vLLM release whose rules apply (default: the GPU or CPU pin).",
    ),
]

GDN_CHECKPOINTS_SINCE = (0, 33)
"""The first vLLM minor whose FlashInfer GDN prefill exports align-mode checkpoints."""
FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64
"""FlashInfer's GDN prefill emits states every 64-token chunk: checkpoints sit on that grid."""
FLASHINFER_GDN_BLACKWELL_KEY_HEAD_DIM = 128
"""On Blackwell, FlashInfer's GDN prefill takes only this key head dim (else Triton)."""
GDN_CHECKPOINT_BLOCKS = 1
"""Extra state blocks per request a checkpointing GDN layer keeps in align mode."""


class GpuTarget(BaseModel):
    """What a hybrid layout is predicted for: the vLLM release and, on a GPU, its card."""

    model_config = ConfigDict(frozen=True)

    vllm_version: VllmVersion
    capability: tuple[int, int] | None = Field(
        None, description="CUDA compute capability; None: CPU, or a GPU not named."
    )
    gpu: str | None = Field(None, description="The card as named or detected, for notes.")


def cpu_target() -> GpuTarget:
    """CPU vLLM: the vllm-cpu pin, no CUDA capability."""
    return GpuTarget(vllm_version=VLLM_CPU_VERSION)


def gpu_target(
    gpu: str | None = None, *, vllm_version: str | None = None, capability: str | None = None
) -> GpuTarget:
    """A GPU target from a card name (`h100`, or an nvidia-smi name such as "NVIDIA H100 80GB
    HBM3") or a compute capability ("9.0"); vLLM defaults to the GPU pin.

    Raises:
        ConfigError: a capability that is not MAJOR.MINOR, or a version that is not X.Y[.Z].
    """
    version = vllm_version or VLLM_GPU_VERSION
    if not re.fullmatch(VERSION_PATTERN, version):
        raise ConfigError(f"vLLM version {version!r} is not X.Y or X.Y.Z: give e.g. 0.33.0")
    cap = _capability(capability) if capability is not None else None
    name = card_of(gpu) if gpu is not None else None
    if cap is None and name is not None:
        cap = GPU_CAPABILITY[name]
    label = name or (f"compute capability {cap[0]}.{cap[1]}" if cap else None)
    return GpuTarget(vllm_version=version, capability=cap, gpu=label)


def card_of(description: str) -> GpuName | None:
    """The card a `--gpu` value or an nvidia-smi name names, or None (a card not listed)."""
    lowered = description.lower()
    for name in GPU_CAPABILITY:
        if re.search(rf"(^|[^a-z0-9]){name}([^0-9]|$)", lowered):
            return name
    return None


def _capability(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(?:sm_?)?(\d+)\.?(\d)", text.strip().lower())
    if match is None:
        raise ConfigError(
            f"compute capability {text!r} is not MAJOR.MINOR: give e.g. 9.0 (H100/H200), "
            "8.0 (A100) or 10.0 (B200)"
        )
    return int(match.group(1)), int(match.group(2))


def gdn_checkpoint_alignment(target: GpuTarget, key_head_dim: int | None) -> int | None:
    """The token grid a GDN layer's align-mode prefill checkpoints sit on for `target`, or None
    when its prefill runs on Triton and exports none (vLLM 0.32, CPU, A100, an unknown card)."""
    minor = tuple(int(part) for part in target.vllm_version.split(".")[:2])
    if minor < GDN_CHECKPOINTS_SINCE or target.capability is None:
        return None
    major = target.capability[0]
    hopper = target.capability == (9, 0)
    blackwell = major in (10, 12) and key_head_dim == FLASHINFER_GDN_BLACKWELL_KEY_HEAD_DIM
    return FLASHINFER_GDN_CHECKPOINT_ALIGNMENT if hopper or blackwell else None
