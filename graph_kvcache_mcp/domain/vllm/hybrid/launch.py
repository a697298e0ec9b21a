"""The flags a hybrid model needs to start and cache on each platform, and what is refused.
Pure: no I/O.

Measured on CPU vLLM 0.32 (docs/vllm.md, "Hybrid models"): with prefix caching on, vLLM picks
align mode for a Mamba2 hybrid by itself, and the first prompt longer than one
Mamba chunk then kills the engine core (the CPU scan kernel returns only a sequence's final
state, while align mode asks for a checkpoint inside a multi-chunk step). What works: one block
per step (`--max-num-batched-tokens B`, B the block vLLM will use) and a Mamba chunk of at least
B (`--hf-overrides`). Read in vLLM 0.32's and 0.33's source: both derive the Mamba cache mode
from prefix caching (align with it, none without; 0.33 deprecates `--mamba-cache-mode` and
ignores it), so the plan never passes that flag. A gated delta net on CPU sets no prefill
checkpoint and needs neither; Mamba1
(Jamba, Mamba) has no CPU scan kernel at all. LMCache's MP connector cannot register several KV
cache groups on CPU.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.lmcache.hybrid_families import family_of
from graph_kvcache_mcp.domain.lmcache.model import HybridFamily, ModelFacts, read_geometry
from graph_kvcache_mcp.domain.lmcache.process_spec import flag_value
from graph_kvcache_mcp.domain.versions import LMCACHE_VERSION
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import GpuTarget
from graph_kvcache_mcp.domain.vllm.hybrid.layout import (
    PlatformKind,
    PredictedHybridLayout,
    gpu_rule_note,
    hybrid_layout,
)
from graph_kvcache_mcp.errors import ConfigError

CPU_HYBRID_BLOCK_SIZE = 128
"""The block asked for a hybrid on CPU when none is given: vLLM's CPU default, and no smaller
than vLLM's CPU max_num_seqs (128), which one-block steps must not undercut."""
MAX_NUM_SEQS = {"cpu": 128, "gpu": 1024}
"""vLLM's largest default max_num_seqs for its API server (CPU; a large-memory GPU): a step of
one block must not be smaller (vLLM refuses max_num_batched_tokens < max_num_seqs)."""
HYBRID_FLAGS = (
    "--max-num-batched-tokens",
    "--max-num-seqs",
    "--hf-overrides",
)


@dataclass(frozen=True)
class HybridPlan:
    """What a hybrid adds to vLLM's command line, and why."""

    layout: PredictedHybridLayout
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def model_text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (a multimodal one keeps it in `text_config`)."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, Mapping) else config


def refuse_unservable(
    config: Mapping[str, Any] | None, platform: PlatformKind, *, lmcache_mp: bool
) -> ModelFacts | None:
    """The hybrid's facts when `config` describes one this platform can serve; None otherwise.

    Raises:
        ConfigError: a Mamba1 model on CPU, or LMCache's MP connector on CPU for a hybrid of
            several KV cache groups; says why and what to use instead.
    """
    if config is None:
        return None
    family = family_of(model_text(config))
    if family is None:
        return None
    if family.mixer == "mamba1" and platform == "cpu":
        raise ConfigError(
            f"{family.label} is a Mamba1 model: vLLM's CPU backend has no Mamba1 scan kernel "
            "(the first prefill fails with \"'_C' object has no attribute "
            "'selective_scan_fwd'\"); serve it on a GPU"
        )
    facts = read_geometry(config, name=str(config.get("_name_or_path") or family.label)).facts
    if platform == "cpu" and lmcache_mp:
        layout = hybrid_layout(facts, "cpu")
        if layout.kv_cache_groups > 1:
            raise ConfigError(cpu_mp_limit(family.label, layout.kv_cache_groups))
    return facts


def cpu_mp_limit(label: str, groups: int) -> str:
    """Why LMCache's MP connector cannot serve this hybrid on CPU, and what can."""
    return (
        f"LMCache's MP connector cannot serve this {label} hybrid on CPU: vLLM gives it "
        f"{groups} KV cache groups and LMCache {LMCACHE_VERSION} registers only one on CPU (vLLM "
        "would fail "
        "after about a minute). Use kv_connector=engine (the engine as vLLM's KV tier), or "
        "mp_native on a GPU"
    )


def plan_hybrid(
    facts: ModelFacts,
    platform: PlatformKind,
    *,
    block_size: int | None,
    lmcache_mp: bool,
    extra_args: tuple[str, ...],
    target: GpuTarget | None = None,
) -> HybridPlan:
    """The flags `facts` needs on `platform` (prefix caching on; `lmcache_mp`: behind
    LMCache's MP connector; `target`: the vLLM and card), with a note for each."""
    assert facts.hybrid is not None
    hybrid = facts.hybrid
    layout = hybrid_layout(facts, platform, block_size=block_size, target=target)
    block = layout.block_size
    label = hybrid.model_family or "hybrid"
    notes = [
        f"{label} hybrid: vLLM will use block {block} ({layout.kv_cache_groups} KV cache "
        f"groups, Mamba page padded {layout.padding_pct}%)"
        + (
            f"; it raises the requested {layout.requested_block_size}"
            if layout.block_raised
            else ""
        )
    ]
    wanted: list[tuple[str, str, str]] = []
    one_block_steps = (platform == "cpu" and hybrid.family == "mamba2") or (
        platform == "gpu" and lmcache_mp
    )
    if one_block_steps:
        why = (
            "align mode stores the state at block ends; CPU's scan returns only a final state, "
            "so each step must end on a block"
            if platform == "cpu"
            else "LMCache's hybrid rule: max batched tokens in [B, 2B)"
        )
        wanted.append(("--max-num-batched-tokens", str(block), why))
        if block < MAX_NUM_SEQS[platform]:
            wanted.append(("--max-num-seqs", str(block), "vLLM needs max_num_seqs <= batch"))
    chunk = hybrid.chunk_size
    if platform == "cpu" and hybrid.family == "mamba2" and chunk is not None and chunk < block:
        override = json.dumps({hybrid.chunk_key: block}, separators=(",", ":"))
        why = f"the model's Mamba chunk {chunk} < block {block} crashes align mode on CPU"
        wanted.append(("--hf-overrides", override, why))
    if hybrid.family == "gdn" and platform == "cpu":
        notes.append("gated delta net: no prefill checkpoints on CPU, vLLM's defaults cache it")
    if (card := gpu_rule_note(layout, facts)) is not None:
        notes.append(card)
    flags: list[str] = []
    given = {arg.split("=", 1)[0] for arg in extra_args}
    for flag, value, why in wanted:
        if flag in given:
            notes.append(f"{flag} from extra_args kept (this plan would give {value}: {why})")
            continue
        flags += [flag, value]
        notes.append(f"{flag} {value}: {why}")
    return HybridPlan(layout=layout, flags=flags, notes=notes)


CPU_DEFAULT_BATCHED_TOKENS = 2048
"""vLLM's max_num_batched_tokens for its API server on CPU when none is given."""


class HybridRun(BaseModel):
    """What a running vLLM serves, when it is a hybrid: read from its model's config.json and
    the command it was started with (for diagnose_stack)."""

    model_config = ConfigDict(frozen=True)

    model_family: str
    mixer: HybridFamily
    platform: PlatformKind
    max_num_batched_tokens: int | None = Field(None, description="None: vLLM's default.")
    chunk_size: int | None = Field(None, description="The Mamba chunk after --hf-overrides.")


def hybrid_run(
    config: Mapping[str, Any] | None, command: Sequence[str], platform: PlatformKind
) -> HybridRun | None:
    """The hybrid a vLLM started with `command` serves, or None (not a known hybrid)."""
    if config is None:
        return None
    text = model_text(config)
    family = family_of(text)
    if family is None:
        return None
    chunk = text.get(family.chunk_key) if family.chunk_key else None
    overrides = flag_value(command, "--hf-overrides")
    if overrides is not None and family.chunk_key:
        with contextlib.suppress(ValueError, AttributeError):  # vLLM refuses a broken one
            chunk = json.loads(overrides).get(family.chunk_key, chunk)
    batched = flag_value(command, "--max-num-batched-tokens")
    return HybridRun(
        model_family=family.label,
        mixer=family.mixer,
        platform=platform,
        max_num_batched_tokens=int(batched) if batched and batched.isdigit() else None,
        chunk_size=chunk if isinstance(chunk, int) and not isinstance(chunk, bool) else None,
    )
