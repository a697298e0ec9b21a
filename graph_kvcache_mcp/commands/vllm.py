"""`graph-kvcache-mcp vllm chat|metrics|start|stop|status|logs|summary`: vLLM from the shell.

Each verb calls the same operation as its tool (`services.vllm`) and `--json` prints the model the
tool returns. Exit codes: 0 ok, 2 bad input (vLLM refused the request, unknown model), 3 vLLM
unavailable (unreachable, timed out, or a bad answer: the reason says which).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TypeVar, get_args

import anyio
from pydantic import ValidationError

from graph_kvcache_mcp.commands._common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    common_options,
    emit,
    note,
)
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import engine_environment
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.files.trace_log import append_traces
from graph_kvcache_mcp.connectors.lmcache.access import lmcache_python
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus, RespPeer
from graph_kvcache_mcp.connectors.stack.mp_stack import attach_lmcache_tier
from graph_kvcache_mcp.connectors.vllm.access import open_client
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmLogs, VllmStopResult
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec
from graph_kvcache_mcp.domain.lmcache.stack import MP_CONNECTORS, StackOptions
from graph_kvcache_mcp.domain.vllm.launch import KvConnector, VllmLaunch
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot, UnknownModel
from graph_kvcache_mcp.domain.vllm.traces import Trace, TraceSummary
from graph_kvcache_mcp.errors import ConfigError, VllmRequestError, describe_validation
from graph_kvcache_mcp.services.vllm import operations as vllm_service
from graph_kvcache_mcp.services.vllm.restart_reuse import (
    RestartMode,
    RestartReuseOut,
    ReuseCall,
    measure_restart_reuse,
)
from graph_kvcache_mcp.services.vllm.stack import start_mp_stack
from graph_kvcache_mcp.services.vllm.views import (
    VllmChatOut,
    VllmMetricsOut,
    VllmStatusOut,
)

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("vllm", help="talk to, measure and manage a vLLM server")
    verbs = group.add_subparsers(
        dest="verb", required=True, metavar="{chat,metrics,start,stop,status,logs,summary}"
    )
    parent = common_options()
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument(
        "--base-url",
        dest="vllm_base_url",
        default=None,
        help="vLLM OpenAI base URL (default: $VLLM_BASE_URL or http://127.0.0.1:8000/v1)",
    )

    chat = verbs.add_parser("chat", parents=[parent, target], help="one chat call + its trace")
    chat.add_argument("--model", default=None, help="served model (default: the only one)")
    chat.add_argument("--message", required=True, help="the user turn")
    chat.add_argument("--system-file", type=Path, default=None, help="system message file")
    chat.add_argument("--max-tokens", type=int, default=64)
    chat.add_argument("--temperature", type=float, default=0.0)
    chat.add_argument("--stream", action="store_true", help="stream (measures TTFT)")
    chat.add_argument("--trace-file", type=Path, default=None, help="append the trace (JSONL)")
    chat.set_defaults(handler=run_chat)

    metrics = verbs.add_parser("metrics", parents=[parent, target], help="/metrics snapshot")
    metrics.add_argument("--model", default=None, help="model_name to report (default: all)")
    metrics.set_defaults(handler=run_metrics)

    start = verbs.add_parser("start", parents=[parent, target], help="start (or reuse) vLLM")
    start.add_argument("--model", required=True, help="local model dir or hub id")
    start.add_argument("--port", type=int, default=None, help="default: the --base-url port")
    start.add_argument("--served-model-name", default=None)
    start.add_argument("--max-model-len", type=int, default=None)
    start.add_argument("--dtype", default="auto")
    start.add_argument("--gpu-memory-utilization", type=float, default=None)
    start.add_argument("--block-size", type=int, default=None)
    start.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    start.add_argument("--dev-mode", action="store_true", help="VLLM_SERVER_DEV_MODE=1")
    start.add_argument(
        "--kv-connector",
        choices=get_args(KvConnector),
        default="none",
        help="external KV tier: engine (EngineKVConnector, CPU vLLM) or an LMCache mode",
    )
    start.add_argument(
        "--kv-events",
        action="store_true",
        help="publish KV events (private ipc feed, loopback replay port) for `fleet`",
    )
    start.add_argument(
        "--no-prompt-tokens-details",
        action="store_true",
        help="leave out --enable-prompt-tokens-details (cached tokens then come from /metrics)",
    )
    start.add_argument(
        "--extra-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more vLLM argument (repeat; use --extra-arg=--flag for flags)",
    )
    start.add_argument(
        "--python",
        dest="vllm_python",
        type=Path,
        default=None,
        help="interpreter with vLLM (default: $GRAPH_KVCACHE_VLLM_PYTHON or this one)",
    )
    start.add_argument("--ready-timeout-s", type=float, default=600.0)
    start.add_argument(
        "--lmcache-port",
        type=int,
        default=None,
        help="mp_native: the lmcache server's port (default: $GRAPH_KVCACHE_LMCACHE_PORT or 5555)",
    )
    start.add_argument(
        "--lmcache-http-port",
        type=int,
        default=None,
        help="mp_native: its HTTP port (default: $GRAPH_KVCACHE_LMCACHE_HTTP_PORT or 8080)",
    )
    start.add_argument(
        "--chunk-size", type=int, default=None, help="mp_native: tokens per LMCache chunk (256)"
    )
    start.set_defaults(handler=run_start)

    reuse = verbs.add_parser(
        "restart-reuse",
        parents=[parent],
        help="cold call, restart vLLM, same call: KV reuse through the engine",
    )
    reuse.add_argument("--prompt-tokens", type=int, default=2048)
    reuse.add_argument("--ready-timeout-s", type=float, default=600.0)
    reuse.add_argument(
        "--restart",
        choices=get_args(RestartMode),
        default="vllm",
        help="vllm, or stack (mp_native: the lmcache server too, so hits come from the engine)",
    )
    reuse.set_defaults(handler=run_restart_reuse)

    stop = verbs.add_parser("stop", parents=[parent], help="stop the vLLM we started")
    stop.add_argument("--wait-s", type=float, default=15.0, help="SIGTERM grace before SIGKILL")
    stop.set_defaults(handler=run_stop)

    status = verbs.add_parser("status", parents=[parent, target], help="is it running, answering")
    status.set_defaults(handler=run_status)

    logs = verbs.add_parser("logs", parents=[parent], help="tail the managed vLLM's log")
    logs.add_argument("--lines", type=int, default=50)
    logs.set_defaults(handler=run_logs)

    summary = verbs.add_parser("summary", parents=[parent], help="summarize a JSONL trace file")
    summary.add_argument("traces", type=Path, help="JSONL file, one trace per line")
    summary.set_defaults(handler=run_summary)


# --- handlers --------------------------------------------------------------------------------


def run_chat(args: argparse.Namespace, settings: Settings) -> int:
    system = args.system_file.read_text(encoding="utf-8") if args.system_file else None
    messages = vllm_service.conversation(args.message, system, None)

    async def call() -> VllmChatOut:
        async with open_client(settings) as client:
            attach_lmcache_tier(client, settings.data_dir)
            return await vllm_service.chat(
                client,
                messages,
                model=args.model or settings.vllm_model,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                stream=args.stream,
            )

    out = _guarded(call)
    if isinstance(out, int):
        return out
    if args.trace_file is not None and out.trace is not None:
        append_traces(args.trace_file, [out.trace])
    if args.json:
        print(out.model_dump_json())
    elif out.trace is None:
        note(f"error: {out.reason}")
    else:
        print(out.answer)
        note(describe_trace(out.trace))
    return EXIT_OK if out.reachable else EXIT_UNAVAILABLE


def run_metrics(args: argparse.Namespace, settings: Settings) -> int:
    async def call() -> VllmMetricsOut:
        async with open_client(settings) as client:
            attach_lmcache_tier(client, settings.data_dir)
            return await vllm_service.metrics(client, args.model or settings.vllm_model)

    out = _guarded(call)
    if isinstance(out, int):
        return out
    if out.snapshot is None and not args.json:
        note(f"error: {out.reason}")
    else:
        emit(out, as_json=args.json, human=describe_metrics)
    return EXIT_OK if out.reachable else EXIT_UNAVAILABLE


def run_start(args: argparse.Namespace, settings: Settings) -> int:
    port = args.port or parse_http_url(settings.vllm_base_url, what="VLLM_BASE_URL").port
    try:
        launch = _launch_from(args, port, args.lmcache_port or settings.lmcache_port)
    except ValidationError as exc:
        problems = describe_validation(exc, whole="flags")
        raise ConfigError(f"invalid vllm start flags: {problems}") from None
    managed = ManagedVllm(settings.data_dir, python=settings.vllm_python)
    if launch.kv_connector in MP_CONNECTORS:
        http_port = args.lmcache_http_port or settings.lmcache_http_port
        options = StackOptions(http_port=http_port, chunk_size=args.chunk_size)
        out = anyio.run(partial(_start_stack, args, settings, managed, launch, options))
        emit(out, as_json=args.json, human=describe_status)
        return EXIT_OK
    out = vllm_service.start(
        managed,
        launch,
        env=engine_environment(settings) if launch.needs_engine_environment else None,
        ready_timeout_s=args.ready_timeout_s,
        progress=None if args.json else (lambda _elapsed, _total, message: note(message)),
        calls_base_url=settings.vllm_base_url,
    )
    emit(out, as_json=args.json, human=describe_status)
    return EXIT_OK


async def _start_stack(
    args: argparse.Namespace,
    settings: Settings,
    managed: ManagedVllm,
    launch: VllmLaunch,
    options: StackOptions,
) -> VllmStatusOut:
    """The stack from the CLI: each piece it starts runs until its own `stop` command."""

    async def ensure_engine() -> None:
        if settings.kv_url is None:
            await anyio.to_thread.run_sync(
                partial(ManagedEngine(settings.data_dir).start, resp=launch.l2_over_resp)
            )

    async def start_lmcache(
        server: ProcessSpec, env: Mapping[str, str], peer: RespPeer | None
    ) -> LmcacheStatus:
        lmcache = ManagedLmcache(settings.data_dir, python=lmcache_python(settings))
        return await anyio.to_thread.run_sync(
            partial(lmcache.start, server, env=env, resp_peer=peer)
        )

    return await start_mp_stack(
        managed,
        launch,
        settings,
        ensure_engine=ensure_engine,
        start_lmcache=start_lmcache,
        options=options,
        ready_timeout_s=args.ready_timeout_s,
        progress=None if args.json else (lambda _elapsed, _total, message: note(message)),
    )


def _launch_from(args: argparse.Namespace, port: int, lmcache_port: int) -> VllmLaunch:
    return VllmLaunch(
        model=args.model,
        port=port,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        block_size=args.block_size,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        prompt_tokens_details=not args.no_prompt_tokens_details,
        dev_mode=args.dev_mode,
        kv_connector=args.kv_connector,
        kv_events=args.kv_events,
        lmcache_port=lmcache_port,
        extra_args=tuple(args.extra_arg),
    )


def run_restart_reuse(args: argparse.Namespace, settings: Settings) -> int:
    managed = ManagedVllm(settings.data_dir, python=settings.vllm_python)
    out = anyio.run(
        partial(
            measure_restart_reuse,
            managed,
            settings,
            prompt_tokens=args.prompt_tokens,
            env=engine_environment(settings),
            ready_timeout_s=args.ready_timeout_s,
            mode=args.restart,
            progress=None if args.json else (lambda _elapsed, _total, message: note(message)),
        )
    )
    emit(out, as_json=args.json, human=_describe_reuse)
    return EXIT_OK


def _describe_reuse(out: RestartReuseOut) -> str:
    def ttft(call: ReuseCall) -> str:
        return f"{call.ttft_s:.3f} s" if call.ttft_s is not None else "unknown"

    warm = out.restarted
    source = f"{warm.external_hit_tokens} from the KV tier"
    if warm.lmcache_l1_hit_tokens is not None or warm.lmcache_l2_hit_tokens is not None:
        source += f": LMCache L1 {warm.lmcache_l1_hit_tokens}, L2 {warm.lmcache_l2_hit_tokens}"
    lines = [
        f"prompt {out.prompt_tokens} tokens; restarted {' and '.join(out.restarted_processes)} "
        f"in {out.restart_s:.1f} s",
        f"  cold:      TTFT {ttft(out.cold)}, cached {out.cold.cached_tokens}",
        f"  restarted: TTFT {ttft(warm)}, cached {warm.cached_tokens} ({source})",
        f"  TTFT speed-up: {out.ttft_speedup}x; engine bytes stored {out.engine_bytes_stored}, "
        f"loaded {out.engine_bytes_loaded}",
    ]
    lines += [f"  note: {n}" for n in out.notes]
    return "\n".join(lines)


def run_stop(args: argparse.Namespace, settings: Settings) -> int:
    result = vllm_service.stop(ManagedVllm(settings.data_dir), wait_s=args.wait_s)
    emit(result, as_json=args.json, human=_describe_stop)
    return EXIT_OK


def run_status(args: argparse.Namespace, settings: Settings) -> int:
    port = parse_http_url(settings.vllm_base_url, what="VLLM_BASE_URL").port
    out = vllm_service.status(
        ManagedVllm(settings.data_dir), port=port, tools_base_url=settings.vllm_base_url
    )
    emit(out, as_json=args.json, human=describe_status)
    return EXIT_OK if out.reachable else EXIT_UNAVAILABLE


def run_logs(args: argparse.Namespace, settings: Settings) -> int:
    logs = vllm_service.logs(ManagedVllm(settings.data_dir), lines=args.lines)
    emit(logs, as_json=args.json, human=_describe_logs)
    return EXIT_OK if logs.exists else EXIT_UNAVAILABLE


def run_summary(args: argparse.Namespace, _settings: Settings) -> int:
    out = vllm_service.file_summary(args.traces)
    if out.bad_line_count and not args.json:
        note(f"skipped {out.bad_line_count} line(s) that were not traces: {out.bad_lines[:10]}")
    emit(out, as_json=args.json, human=lambda o: describe_summary(o.summary))
    return EXIT_OK


def _guarded(call: Callable[[], Awaitable[T]]) -> T | int:
    """Run an async call; its result, or exit 2 after saying why on stderr when vLLM refused the
    request or does not serve the model (bad input)."""
    try:
        return anyio.run(call)
    except (VllmRequestError, UnknownModel) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


# --- human output ----------------------------------------------------------------------------


def describe_trace(trace: Trace) -> str:
    if trace.prefix_cache_hit_tokens is None:
        cache = f"cached tokens unavailable ({trace.note})"
    else:
        cache = (
            f"{trace.prefix_cache_hit_tokens}/{trace.prompt_tokens} prompt tokens from the prefix "
            f"cache ({trace.cached_tokens_source})"
        )
    ttft = f", ttft {trace.ttft_s * 1000:.0f} ms" if trace.ttft_s is not None else ""
    return f"{cache}; {trace.completion_tokens} generated; {trace.latency_s * 1000:.0f} ms{ttft}"


def describe_metrics(out: VllmMetricsOut) -> str:
    return describe_snapshot(out.snapshot) if out.snapshot else f"unavailable: {out.reason}"


def describe_snapshot(snapshot: MetricsSnapshot) -> str:
    def show(value: object) -> str:
        if value is None:
            return "n/a (not exported)"
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = [
        ("model", snapshot.model_name or "(all models)"),
        ("engines", ", ".join(snapshot.engines) or "none"),
        ("prefix cache queries (tokens)", show(snapshot.prefix_cache_queries_tokens)),
        ("prefix cache hits (tokens)", show(snapshot.prefix_cache_hits_tokens)),
        ("prefix cache hit rate", show(snapshot.prefix_cache_hit_rate)),
        ("external cache queries (tokens)", show(snapshot.external_prefix_cache_queries_tokens)),
        ("external cache hits (tokens)", show(snapshot.external_prefix_cache_hits_tokens)),
        ("prompt tokens by source", show(snapshot.prompt_tokens_by_source)),
        ("kv cache usage", show(snapshot.kv_cache_usage_perc)),
        (
            "requests running / waiting",
            f"{snapshot.requests_running} / {snapshot.requests_waiting}",
        ),
        ("ttft mean (s)", show(snapshot.ttft.mean_s if snapshot.ttft else None)),
    ]
    if snapshot.cache_config is not None:
        config = snapshot.cache_config
        rows.append(("block size", show(config.block_size)))
        rows.append(("prefix caching", show(config.enable_prefix_caching)))
    if snapshot.engine_kv_loaded_bytes is not None:  # vLLM runs EngineKVConnector
        rows.append(
            (
                "engine KV loaded / saved",
                f"{snapshot.engine_kv_loaded_blocks} blocks, {snapshot.engine_kv_loaded_bytes} B"
                f" / {snapshot.engine_kv_saved_blocks} blocks, {snapshot.engine_kv_saved_bytes} B",
            )
        )
        rows.append(
            (
                "engine KV failed loads / dropped saves",
                f"{snapshot.engine_kv_load_failed_blocks} / {snapshot.engine_kv_dropped_blocks}",
            )
        )
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def describe_status(status: VllmStatusOut) -> str:
    if not status.running:
        return f"vllm: not running ({status.reason})"
    health = "answering" if status.reachable else f"NOT answering: {status.reason}"
    owner = "started by this tool" if status.managed_by_us else "NOT started by this tool"
    reused = ", already running (reused)" if status.reused else ""
    lines = [f"vllm: running{reused}, {health}, {owner}", f"  url      {status.base_url}"]
    if status.served_models:
        lines.append(f"  models   {', '.join(status.served_models)}")
    if status.pid is not None:
        lines.append(f"  pid      {status.pid}")
    if status.platform is not None:
        lines.append(f"  platform {status.platform.kind} ({status.platform.detail})")
    lines += [f"  note     {line}" for line in status.notes]
    if status.startup_s is not None:
        lines.append(f"  startup  {status.startup_s:.1f} s")
    if status.log_path:
        lines.append(f"  log      {status.log_path}")
    if status.reason and status.reachable:
        lines.append(f"  ({status.reason})")
    return "\n".join(lines)


def describe_summary(summary: TraceSummary) -> str:
    def rate(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 1000:.0f} ms"

    lines = [
        f"calls                  {summary.calls} ({summary.calls_with_cache_info} with cache info)",
        f"sources                {summary.calls_by_source}",
        f"avg prefix hit rate    {rate(summary.avg_prefix_cache_hit_rate)}",
        f"token hit rate         {rate(summary.token_hit_rate)}",
        f"tokens saved           {summary.total_tokens_saved}",
        f"latency p50 / p95      {ms(summary.latency_p50_s)} / {ms(summary.latency_p95_s)}",
    ]
    if summary.compute_saved is not None:
        lines.append(f"prefill saved (est.)   {summary.compute_saved.seconds:.3f} s")
        lines.append(f"  basis: {summary.compute_saved.basis}")
    if summary.note:
        lines.append(f"note: {summary.note}")
    return "\n".join(lines)


def _describe_stop(result: VllmStopResult) -> str:
    if not result.stopped:
        return f"vllm: nothing stopped ({result.reason})"
    left = f"; still alive: {result.leftover_pids}" if result.leftover_pids else ""
    return f"vllm: stopped pid {result.pid} ({result.how}){left}"


def _describe_logs(logs: VllmLogs) -> str:
    if not logs.exists:
        return f"vllm: no log at {logs.log_path}"
    return logs.text
