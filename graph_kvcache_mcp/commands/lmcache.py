"""`graph-kvcache-mcp lmcache config|start|stop|status|check|key|coordinator`: LMCache
configuration, the managed `lmcache server`, adapter checks, and the coordinator as a service
(`commands/lmcache_coordinator.py`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import get_args

from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.commands import lmcache_coordinator
from graph_kvcache_mcp.commands._common import (
    EXIT_MISS,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    Verbs,
    common_options,
    emit,
    note,
    run_blocking,
)
from graph_kvcache_mcp.commands._flags import (
    add_flag,
    add_launch_flags,
    add_model_flags,
    model_from_args,
)
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus
from graph_kvcache_mcp.domain.lifecycle import StopWait
from graph_kvcache_mcp.domain.lmcache.choices import LmcacheChoices
from graph_kvcache_mcp.domain.lmcache.config import LmcachePlan
from graph_kvcache_mcp.domain.lmcache.keys import (
    DEFAULT_NAMESPACE,
    KEY_SCHEME_VERSION,
    Namespace,
    engine_key,
)
from graph_kvcache_mcp.domain.lmcache.model import Count, KvKind, ModelFacts
from graph_kvcache_mcp.domain.lmcache.stack import Coordinator
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.services.lmcache.check import (
    DEFAULT_PAGE_BYTES,
    LmcacheCheckOut,
    PageBytes,
    run_lmcache_check,
)
from graph_kvcache_mcp.services.lmcache.plan import (
    LmcacheConfigOut,
    build_plan,
    model_facts,
    plan_for_this_host,
)
from graph_kvcache_mcp.services.stack.lifetime import RunsUntilStop
from graph_kvcache_mcp.services.stack.stack import Stack


class LmcacheKeyOut(BaseModel):
    """Where LMCache's chunk `lmcache_key` lives in the engine."""

    model_config = ConfigDict(frozen=True)

    lmcache_key: str
    engine_key: str
    namespace: str
    scheme_version: int


def register(subparsers: Verbs) -> None:
    group = subparsers.add_parser(
        "lmcache", help="LMCache with the engine as its remote tier: config, check, keys"
    )
    verbs = group.add_subparsers(dest="verb", required=True)
    parent = common_options()

    config = verbs.add_parser(
        "config", parents=[parent], help="lmcache server / vLLM / YAML configuration for a model"
    )
    _plan_arguments(config)
    config.add_argument(
        "--write-yaml", type=Path, help="in-process mode: also write the YAML to this new file"
    )
    config.set_defaults(handler=run_config)

    start = verbs.add_parser(
        "start", parents=[parent], help="start (or reuse) the lmcache server `config` plans"
    )
    _plan_arguments(start)
    add_launch_flags(
        start,
        program="`lmcache server`",
        python_dest="lmcache_python",
        python_env="GRAPH_KVCACHE_LMCACHE_PYTHON",
        ready_timeout_s=180.0,
    )
    add_flag(
        start,
        "--coordinator",
        Coordinator,
        help="join an LMCache coordinator: 'managed' (started in the data dir, stopped by "
        "`lmcache stop`) or its URL (used, never stopped)",
    )
    start.set_defaults(handler=run_start)

    _add_process_verbs(verbs, parent)
    _add_key_verbs(verbs, parent)


def _add_process_verbs(verbs: Verbs, parent: argparse.ArgumentParser) -> None:
    stop = verbs.add_parser(
        "stop",
        parents=[parent],
        help="stop the lmcache server we started, even while sessions use it",
    )
    add_flag(stop, "--wait-s", StopWait, default=15.0, help="SIGTERM grace before SIGKILL")
    stop.add_argument(
        "--force",
        action="store_true",
        help="also when the managed vLLM uses the server: vLLM is stopped first",
    )
    stop.set_defaults(handler=run_stop)

    status = verbs.add_parser(
        "status", parents=[parent], help="health, L1 usage, L2 adapters, which sessions use it"
    )
    status.set_defaults(handler=run_status)


def _add_key_verbs(verbs: Verbs, parent: argparse.ArgumentParser) -> None:
    check = verbs.add_parser(
        "check", parents=[parent], help="validate the LMCache adapter against the engine"
    )
    check.add_argument("--url", dest="kv_url", default=None, help="engine base URL")
    add_flag(
        check,
        "--page-bytes",
        PageBytes,
        default=DEFAULT_PAGE_BYTES,
        help=f"bytes of the test page written and read back (default {DEFAULT_PAGE_BYTES})",
    )
    add_flag(
        check,
        "--namespace",
        Namespace,
        default=DEFAULT_NAMESPACE,
        help=f"key namespace of the check's test page (default {DEFAULT_NAMESPACE!r})",
    )
    check.set_defaults(handler=run_check)

    key = verbs.add_parser("key", parents=[parent], help="the engine key of an LMCache key")
    key.add_argument(
        "lmcache_key", metavar="LMCACHE_KEY", help="an LMCache key, as LMCache writes it"
    )
    add_flag(
        key,
        "--namespace",
        Namespace,
        default=DEFAULT_NAMESPACE,
        help=f"the engine key namespace LMCache writes under (default {DEFAULT_NAMESPACE!r})",
    )
    key.set_defaults(handler=run_key)

    lmcache_coordinator.register(verbs)


PLAN_FLAGS = (
    "mode",
    "engine_url",
    "namespace",
    "chunk_size",
    "mamba_block_size",
    "tensor_parallel_size",
    "lmcache_port",
    "lmcache_http_port",
    "l1_size_gb",
    "gpu",
    "vllm_version",
)
"""`LmcacheChoices` fields `config` and `start` take as flags."""


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    """What `config` and `start` share: the model facts and the deployment choices."""
    parser.add_argument("--hf-config", help="local config.json (or model directory)")
    parser.add_argument("--model", help="model id as vLLM serves it (e.g. Qwen/Qwen3-8B)")
    parser.add_argument("--kind", choices=get_args(KvKind), help="KV layout without config.json")
    add_flag(parser, "--num-layers", Count, help="attention layers without config.json")
    add_flag(parser, "--kv-heads", Count, help="KV heads per layer (default: the model's)")
    add_flag(parser, "--head-dim", Count, help="head dimension (default: the model's)")
    parser.add_argument("--kv-dtype", help="KV cache dtype (default: the model's), e.g. fp8")
    parser.add_argument(
        "--vision",
        action="store_true",
        default=None,
        help="the model takes images or video (LMCache caches text-token KV only: a warning)",
    )
    add_model_flags(
        parser,
        LmcacheChoices,
        PLAN_FLAGS,
        flags={"tensor_parallel_size": "--tp"},
        defaults={"engine_url": None},
        helps={
            "mode": "how LMCache runs: mp_native (default), redis_resp or inprocess_plugin",
            "engine_url": "engine KV base URL (default: the resolved engine)",
            "mamba_block_size": "vLLM's hybrid block size",
            "tensor_parallel_size": "tensor-parallel size",
            "gpu": "the GPU card vLLM runs on: a100|h100|h200|b200 or a compute capability such "
            "as 9.0 (default: the card nvidia-smi names; a hybrid's block follows it)",
            "vllm_version": "the vLLM it runs (default: the pin for the platform)",
        },
    )


def run_config(args: argparse.Namespace, settings: Settings) -> int:
    out = _config_out(
        args,
        settings,
        plan=lambda facts, choices: plan_for_this_host(facts, choices, settings.data_dir),
    )
    plan = out.plan
    if args.write_yaml is not None and plan.lmcache_yaml is not None:
        with args.write_yaml.open("x", encoding="utf-8") as handle:  # never overwrite
            handle.write(plan.lmcache_yaml)
    emit(out, as_json=args.json, human=_describe_config)
    return EXIT_OK if plan.supported else EXIT_MISS


def run_start(args: argparse.Namespace, settings: Settings) -> int:
    plan = _config_out(args, settings).plan
    if plan.lmcache_server is None:
        raise ConfigError(
            f"mode {plan.mode} runs no lmcache server (LMCache lives inside vLLM there); use "
            "--mode mp_native or redis_resp"
        )
    server = plan.lmcache_server.model_copy(
        update={"argv": [*plan.lmcache_server.argv, *args.extra_arg]}
    )
    stack = Stack.of(settings, lmcache_python_override=args.lmcache_python)
    start = partial(
        stack.start_server,
        server,
        RunsUntilStop(),  # the server (and a managed coordinator it starts) runs until stop
        ready_timeout_s=args.ready_timeout_s,
        resp=plan.mode == "redis_resp",  # the managed engine's RESP wire, answering first
        coordinator=args.coordinator,
        progress=None if args.json else note,
    )
    status = run_blocking(start)
    emit(status, as_json=args.json, human=_describe_status)
    return EXIT_OK


def run_stop(args: argparse.Namespace, settings: Settings) -> int:
    stack = Stack.of(settings)
    why = stack.stop_blocker()
    if why is not None and not args.force:
        raise ConfigError(
            f"{why}. Stop vLLM first (graph-kvcache-mcp vllm stop), or pass --force to stop vLLM "
            "and then the server"
        )
    result = run_blocking(partial(stack.stop_server, RunsUntilStop(), wait_s=args.wait_s))
    emit(result, as_json=args.json, human=lambda r: r.reason or f"lmcache server {r.how}")
    return EXIT_OK


def run_status(args: argparse.Namespace, settings: Settings) -> int:
    status = Stack.of(settings).server_status()
    emit(status, as_json=args.json, human=_describe_status)
    return EXIT_OK if status.healthy else EXIT_UNAVAILABLE


def _config_out(
    args: argparse.Namespace,
    settings: Settings,
    plan: Callable[[ModelFacts, LmcacheChoices], LmcachePlan] = build_plan,
) -> LmcacheConfigOut:
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
    write_yaml = getattr(args, "write_yaml", None)
    choices = model_from_args(
        LmcacheChoices,
        args,
        [name for name in PLAN_FLAGS if name != "engine_url"],
        engine_url=args.engine_url or resolve_kv_target(settings).base_url,
        insecure_http_hosts=settings.insecure_http_hosts,
        config_file=str(write_yaml) if write_yaml else "lmcache.yaml",
    )
    source = f"config.json at {args.hf_config}" if args.hf_config else "given facts"
    return LmcacheConfigOut(facts=facts, facts_source=source, plan=plan(facts, choices))


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


def _describe_status(status: LmcacheStatus) -> str:
    if not status.running:
        return status.reason or "not running"
    lines = [
        f"lmcache server pid {status.pid}: {'healthy' if status.healthy else 'NOT healthy'}, "
        f"vLLM connects to {status.rpc_url}, admin API {status.http_url}"
    ]
    until = (
        "until `lmcache stop`"
        if status.runs_until_stop
        else "until the last session using it exits"
    )
    sessions = ", ".join(f"pid {lease.pid}" for lease in status.leases) or "none"
    lines.append(f"  runs {until}; sessions {sessions}")
    if status.coordinator_url:
        lines.append(f"  joined the LMCache coordinator at {status.coordinator_url}")
    if (report := status.report) is not None:
        if report.l1_used_bytes is not None and report.l1_total_bytes is not None:
            lines.append(f"  L1 {report.l1_used_bytes:,} of {report.l1_total_bytes:,} bytes")
        for adapter in report.l2_adapters:
            lines.append(f"  L2 adapter {adapter.index}: healthy={adapter.healthy}")
    if status.reason:
        lines.append(f"  {status.reason}")
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
