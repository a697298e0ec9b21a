"""`graph-kvcache-mcp lmcache config|check|key`: LMCache configuration and adapter checks."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.commands._common import (
    EXIT_MISS,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    common_options,
    emit,
)
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.kv_open import resolve_kv_target
from graph_kvcache_mcp.domain.lmcache_config import MODES, LmcacheChoices
from graph_kvcache_mcp.domain.lmcache_keys import (
    DEFAULT_NAMESPACE,
    KEY_SCHEME_VERSION,
    engine_key,
)
from graph_kvcache_mcp.domain.lmcache_model import KvKind
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.services.lmcache_check import (
    DEFAULT_PAGE_BYTES,
    LmcacheCheckOut,
    run_lmcache_check,
)
from graph_kvcache_mcp.services.lmcache_plan import LmcacheConfigOut, build_plan, model_facts


class LmcacheKeyOut(BaseModel):
    """Where LMCache's chunk `lmcache_key` lives in the engine."""

    model_config = ConfigDict(frozen=True)

    lmcache_key: str
    engine_key: str
    namespace: str
    scheme_version: int


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser(
        "lmcache", help="LMCache with the engine as its remote tier: config, check, keys"
    )
    verbs = group.add_subparsers(dest="verb", required=True, metavar="{config,check,key}")
    parent = common_options()

    config = verbs.add_parser(
        "config", parents=[parent], help="lmcache server / vLLM / YAML configuration for a model"
    )
    config.add_argument("--hf-config", help="local config.json (or model directory)")
    config.add_argument("--model", help="model id as vLLM serves it (e.g. Qwen/Qwen3-8B)")
    config.add_argument("--kind", choices=get_args(KvKind), help="KV layout without config.json")
    config.add_argument("--num-layers", type=int, help="attention layers without config.json")
    config.add_argument("--kv-heads", type=int)
    config.add_argument("--head-dim", type=int)
    config.add_argument("--kv-dtype")
    config.add_argument("--vision", action="store_true", default=None)
    config.add_argument("--mode", choices=MODES, default="mp_native")
    config.add_argument("--engine-url", help="engine KV base URL (default: the resolved engine)")
    config.add_argument("--chunk-size", type=int)
    config.add_argument("--mamba-block-size", type=int, help="vLLM's hybrid block size")
    config.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    config.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    config.add_argument("--lmcache-port", type=int, default=5555)
    config.add_argument("--lmcache-http-port", type=int, default=8080)
    config.add_argument("--l1-size-gb", type=float, default=20.0)
    config.add_argument(
        "--write-yaml", type=Path, help="in-process mode: also write the YAML to this new file"
    )
    config.set_defaults(handler=run_config)

    check = verbs.add_parser(
        "check", parents=[parent], help="validate the LMCache adapter against the engine"
    )
    check.add_argument("--url", dest="kv_url", default=None, help="engine base URL")
    check.add_argument("--page-bytes", type=int, default=DEFAULT_PAGE_BYTES)
    check.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    check.set_defaults(handler=run_check)

    key = verbs.add_parser("key", parents=[parent], help="the engine key of an LMCache key")
    key.add_argument("lmcache_key", metavar="LMCACHE_KEY")
    key.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    key.set_defaults(handler=run_key)


def run_config(args: argparse.Namespace, settings: Settings) -> int:
    facts = model_facts(
        hf_config=args.hf_config,
        model=args.model,
        kind=args.kind,
        num_layers=args.num_layers,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        kv_dtype=args.kv_dtype,
        vision=args.vision,
    )
    choices = LmcacheChoices(
        mode=args.mode,
        engine_url=args.engine_url or resolve_kv_target(settings).base_url,
        namespace=args.namespace,
        chunk_size=args.chunk_size,
        mamba_block_size=args.mamba_block_size,
        tensor_parallel_size=args.tp,
        lmcache_port=args.lmcache_port,
        lmcache_http_port=args.lmcache_http_port,
        l1_size_gb=args.l1_size_gb,
        config_file=str(args.write_yaml) if args.write_yaml else "lmcache.yaml",
    )
    plan = build_plan(facts, choices)
    source = f"config.json at {args.hf_config}" if args.hf_config else "given facts"
    out = LmcacheConfigOut(facts=facts, facts_source=source, plan=plan)
    if args.write_yaml is not None and plan.lmcache_yaml is not None:
        with args.write_yaml.open("x", encoding="utf-8") as handle:  # never overwrite
            handle.write(plan.lmcache_yaml)
    emit(out, as_json=args.json, human=_describe_config)
    return EXIT_OK if plan.supported else EXIT_MISS


def run_check(args: argparse.Namespace, settings: Settings) -> int:
    target = resolve_kv_target(settings)
    out = run_lmcache_check(
        target.base_url, target.token, page_bytes=args.page_bytes, namespace=args.namespace
    )
    emit(out, as_json=args.json, human=_describe_check)
    if not out.reachable:
        return EXIT_UNAVAILABLE
    return EXIT_OK if out.passed else EXIT_MISS


def run_key(args: argparse.Namespace, settings: Settings) -> int:
    if not args.lmcache_key:
        raise ConfigError("LMCACHE_KEY is empty: give the key string LMCache logs or stores")
    out = LmcacheKeyOut(
        lmcache_key=args.lmcache_key,
        engine_key=engine_key(args.lmcache_key, namespace=args.namespace),
        namespace=args.namespace,
        scheme_version=KEY_SCHEME_VERSION,
    )
    emit(out, as_json=args.json, human=lambda o: o.engine_key)
    return EXIT_OK


def _describe_config(out: LmcacheConfigOut) -> str:
    plan, model = out.plan, out.plan.model
    lines = [
        f"{model.name}: {model.kind} ({out.facts_source}), mode {plan.mode}"
        + ("" if plan.supported else " — LMCache NOT supported for this model"),
        f"  chunk {model.chunk_size} tokens"
        + (f", ~{model.chunk_bytes:,} bytes per chunk" if model.chunk_bytes else "")
        + (
            f", hybrid block {model.block_size} ({model.block_size_source})"
            if model.block_size
            else ""
        ),
    ]
    if plan.lmcache_server is not None:
        lines += ["", "# lmcache server", plan.lmcache_server.shell]
    lines += ["", "# vLLM", plan.vllm.shell]
    if plan.lmcache_yaml is not None:
        lines += ["", f"# {plan.vllm.env.get('LMCACHE_CONFIG_FILE', 'lmcache.yaml')}"]
        lines.append(plan.lmcache_yaml.rstrip())
    if plan.warnings:
        lines += ["", "warnings:"] + [f"  - {w}" for w in plan.warnings]
    if plan.notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in plan.notes]
    return "\n".join(lines)


def _describe_check(out: LmcacheCheckOut) -> str:
    lines = [f"lmcache adapter check against {out.base_url}: {'PASS' if out.passed else 'FAIL'}"]
    for step in out.steps:
        figures = ", ".join(f"{k}={v}" for k, v in step.figures.items() if not k.startswith("sha"))
        lines.append(f"  [{'ok' if step.passed else 'FAIL'}] {step.name}: {step.detail}")
        if figures:
            lines.append(f"        {figures}")
    if out.engine_key:
        lines.append(f"  test page: {out.page_bytes} bytes at engine key {out.engine_key}")
    return "\n".join(lines)
