"""The `vllm` verbs that talk to a running vLLM or read the managed one's state."""

from __future__ import annotations

import argparse
from functools import partial
from typing import TypeVar

import anyio

from graph_kvcache_mcp.commands._common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    emit,
    note,
)
from graph_kvcache_mcp.commands.vllm._describe import (
    describe_logs,
    describe_metrics,
    describe_reuse,
    describe_status,
    describe_stop,
    describe_summary,
    describe_trace,
)
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.trace_log import append_traces
from graph_kvcache_mcp.services.stack import vllm as managed
from graph_kvcache_mcp.services.stack.engine_death import chat_with_death
from graph_kvcache_mcp.services.stack.stack import Stack
from graph_kvcache_mcp.services.vllm import operations as vllm_service
from graph_kvcache_mcp.services.vllm.restart_reuse import measure_restart_reuse
from graph_kvcache_mcp.services.vllm.views import VllmChatOut, VllmMetricsOut

T = TypeVar("T")


def run_chat(args: argparse.Namespace, settings: Settings) -> int:
    system = args.system_file.read_text(encoding="utf-8") if args.system_file else None
    messages = vllm_service.conversation(args.message, system, None)

    async def call() -> VllmChatOut:
        async with managed.open_metered_client(settings) as client:
            out = await vllm_service.chat(
                client,
                messages,
                model=args.model or settings.vllm_model,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                stream=args.stream,
            )
        return await chat_with_death(out, Stack.of(settings).vllm)

    # vLLM refusing the request (VllmRequestError, UnknownModel) is bad input: main exits 2.
    out = anyio.run(call)
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
        async with managed.open_metered_client(settings) as client:
            return await vllm_service.metrics(client, args.model or settings.vllm_model)

    # vLLM refusing the request (VllmRequestError, UnknownModel) is bad input: main exits 2.
    out = anyio.run(call)
    if out.snapshot is None and not args.json:
        note(f"error: {out.reason}")
    else:
        emit(out, as_json=args.json, human=describe_metrics)
    return EXIT_OK if out.reachable else EXIT_UNAVAILABLE


def run_restart_reuse(args: argparse.Namespace, settings: Settings) -> int:
    out = anyio.run(
        partial(
            measure_restart_reuse,
            Stack.of(settings),
            settings.vllm_base_url,
            prompt_tokens=args.prompt_tokens,
            ready_timeout_s=args.ready_timeout_s,
            mode=args.restart,
            progress=None if args.json else (lambda _elapsed, _total, message: note(message)),
        )
    )
    emit(out, as_json=args.json, human=describe_reuse)
    return EXIT_OK


def run_stop(args: argparse.Namespace, settings: Settings) -> int:
    result = Stack.of(settings).stop_vllm(settings.vllm_base_url, wait_s=args.wait_s)
    emit(result, as_json=args.json, human=describe_stop)
    return EXIT_OK


def run_status(args: argparse.Namespace, settings: Settings) -> int:
    out = Stack.of(settings).vllm_status(settings.vllm_base_url)
    emit(out, as_json=args.json, human=describe_status)
    return EXIT_OK if out.reachable else EXIT_UNAVAILABLE


def run_logs(args: argparse.Namespace, settings: Settings) -> int:
    logs = Stack.of(settings).vllm_logs(settings.vllm_base_url, lines=args.lines)
    emit(logs, as_json=args.json, human=describe_logs)
    return EXIT_OK if logs.exists else EXIT_UNAVAILABLE


def run_summary(args: argparse.Namespace, _settings: Settings) -> int:
    out = vllm_service.file_summary(args.traces)
    if out.bad_line_count and not args.json:
        note(f"skipped {out.bad_line_count} line(s) that were not traces: {out.bad_lines[:10]}")
    emit(out, as_json=args.json, human=lambda o: describe_summary(o.summary))
    return EXIT_OK
