"""vLLM tools (vllm_*): chat with cache accounting, /metrics, the managed server, trace summary."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from graph_kvcache_mcp.connectors.vllm_process import Progress, VllmLogs, VllmStopResult
from graph_kvcache_mcp.domain.bundle import ChatMessage as Turn
from graph_kvcache_mcp.domain.vllm_launch import VllmLaunch
from graph_kvcache_mcp.domain.vllm_metrics import MetricsSnapshot, UnknownModel
from graph_kvcache_mcp.errors import ConfigError, InvalidValue, VllmProcessError, VllmRequestError
from graph_kvcache_mcp.services import vllm as vllm_service
from graph_kvcache_mcp.services.vllm_views import (
    VllmChatOut,
    VllmMetricsOut,
    VllmResetOut,
    VllmStatusOut,
    VllmTraceSummaryOut,
)
from graph_kvcache_mcp.tools._common import (
    CALLS_MODEL,
    READ_ONLY,
    STOPS_PROCESS,
    ToolSpec,
    register_all,
    state_of,
)

TOOLSET = "vllm"
# Dropping the prefix cache changes what later calls cost, so it is a destructive write.
RESETS_CACHE = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)
# vllm_start accepts a hub id, which vLLM then downloads: it may reach beyond this machine.
STARTS_DOWNLOADING = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
)

Model = Annotated[
    str | None,
    Field(description="Served model name; default: VLLM_MODEL, else the server's only model."),
]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


async def vllm_chat(
    ctx: Context[Any],
    message: Annotated[
        str | None, Field(description="The user turn (or give `messages` instead).")
    ] = None,
    system: Annotated[
        str | None, Field(description="A system message sent before `message`.")
    ] = None,
    messages: Annotated[
        list[ChatMessage] | None,
        Field(description="A whole conversation, instead of message/system."),
    ] = None,
    model: Model = None,
    max_tokens: Annotated[int, Field(ge=1, le=4096, description="Answer length cap.")] = 64,
    temperature: Annotated[
        float, Field(ge=0, le=2, description="0 = greedy (repeatable answers).")
    ] = 0.0,
    stream: Annotated[bool, Field(description="Stream, to measure time to first token.")] = False,
) -> VllmChatOut:
    """Send one chat request to vLLM and return the answer plus its Trace: prompt tokens, how
    many were served from vLLM's prefix cache (prefix_cache_hit_tokens) and where that number
    came from (cached_tokens_source: usage, metrics_delta, or unavailable — unknown is never
    reported as 0), latency and, when streamed, time to first token. Repeat a long identical
    prefix (system message) to see cache hits. reachable=false: vLLM is down (see vllm_status)."""
    access = state_of(ctx).vllm
    try:
        turns = None if messages is None else [Turn(**m.model_dump()) for m in messages]
        conversation = vllm_service.conversation(message, system, turns)
        async with access.borrowed() as client:
            out = await vllm_service.chat(
                client,
                conversation,
                model=model or access.settings.vllm_model,
                max_tokens=max_tokens,
                temperature=temperature,
                stream=stream,
            )
    except InvalidValue as exc:
        raise ToolError(str(exc)) from exc
    except VllmRequestError as exc:
        raise ToolError(f"{exc}. Fix the request and call vllm_chat again.") from exc
    if out.trace is not None:
        access.traces.append(out.trace)
    return out


async def vllm_metrics(
    ctx: Context[Any],
    model: Model = None,
    since: Annotated[
        MetricsSnapshot | None,
        Field(
            description="A `snapshot` from an earlier vllm_metrics result: also return the delta."
        ),
    ] = None,
) -> VllmMetricsOut:
    """Read vLLM's Prometheus /metrics for one model: prefix-cache queries and hits (tokens) and
    hit rate, external (KV connector) cache hits, prompt tokens by source, KV cache usage,
    running/waiting requests, a TTFT summary, and the cache config (block size, prefix caching).
    Fields the server does not export are null, not 0. Pass an earlier snapshot as `since` to get
    what moved in between (delta)."""
    access = state_of(ctx).vllm
    try:
        async with access.borrowed() as client:
            return await vllm_service.metrics(client, model or access.settings.vllm_model, since)
    except UnknownModel as exc:
        raise ToolError(f"{exc}. Call vllm_metrics again with one of those models.") from exc


async def vllm_start(
    ctx: Context[Any],
    model: Annotated[str, Field(min_length=1, description="Local model dir or hub id to serve.")],
    port: Annotated[
        int | None,
        Field(ge=1024, le=65535, description="Loopback port; default: the VLLM_BASE_URL port."),
    ] = None,
    served_model_name: Annotated[
        str | None, Field(description="Name clients use; default: `model`.")
    ] = None,
    max_model_len: Annotated[int | None, Field(ge=16, description="Context length cap.")] = None,
    dtype: Annotated[str, Field(description="auto, bfloat16, float16, float32.")] = "auto",
    gpu_memory_utilization: Annotated[
        float | None, Field(gt=0, le=1, description="GPU only; default 0.9.")
    ] = None,
    block_size: Annotated[
        int | None, Field(ge=1, description="KV block size; CPU needs a multiple of 32.")
    ] = None,
    kv_cache_memory_bytes: Annotated[
        int | None, Field(ge=1024**2, description="KV cache size; CPU default 1 GiB.")
    ] = None,
    dev_mode: Annotated[
        bool, Field(description="VLLM_SERVER_DEV_MODE=1, needed by vllm_reset_prefix_cache.")
    ] = False,
    extra_args: Annotated[
        list[str] | None, Field(description="More vLLM flags, e.g. ['--seed', '0'].")
    ] = None,
    ready_timeout_s: Annotated[
        float, Field(gt=0, le=3600, description="Give up (and stop it) if not healthy by then.")
    ] = 600.0,
) -> VllmStatusOut:
    """Ensure a vLLM OpenAI server runs on loopback with prefix caching and per-call cached-token
    counts (--enable-prefix-caching --enable-prompt-tokens-details). A healthy server already
    on the port is reused and nothing starts. Without an NVIDIA GPU it picks CPU-safe flags and
    lists why in `notes`. Reports progress while vLLM loads (often 20 s to minutes) and returns
    once GET /health answers; vllm_chat and vllm_metrics then use it. It keeps running after
    this MCP server exits: stop it with vllm_stop."""
    access = state_of(ctx).vllm
    try:
        launch = VllmLaunch(
            model=model,
            port=port or access.port,
            served_model_name=served_model_name,
            max_model_len=max_model_len,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            block_size=block_size,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            dev_mode=dev_mode,
            extra_args=tuple(extra_args or ()),
        )
        out = await anyio.to_thread.run_sync(
            partial(
                vllm_service.start,
                access.managed,
                launch,
                ready_timeout_s=ready_timeout_s,
                progress=_progress_reporter(ctx),
                calls_base_url=access.base_url,
            )
        )
    except (VllmProcessError, ConfigError) as exc:
        raise ToolError(str(exc)) from exc
    await access.use(out.tools_base_url)
    return out


async def vllm_stop(
    ctx: Context[Any],
    wait_s: Annotated[float, Field(gt=0, le=120, description="SIGTERM grace before SIGKILL.")] = 15,
) -> VllmStopResult:
    """Stop the vLLM server this project started from its data dir: SIGTERM to its process group,
    SIGKILL after `wait_s`. A server this project did not start is never signalled (the result
    says not_running). Its prefix cache is lost."""
    managed = state_of(ctx).vllm.managed
    return await anyio.to_thread.run_sync(partial(vllm_service.stop, managed, wait_s=wait_s))


async def vllm_status(ctx: Context[Any]) -> VllmStatusOut:
    """Report the managed vLLM (pid, port, model, platform and flag notes, uptime, log path) and
    whether it answers; without one, whether anything answers on the configured port."""
    access = state_of(ctx).vllm
    return await anyio.to_thread.run_sync(
        partial(
            vllm_service.status, access.managed, port=access.port, tools_base_url=access.base_url
        )
    )


async def vllm_logs(
    ctx: Context[Any],
    lines: Annotated[int, Field(ge=1, le=500, description="How many last lines.")] = 50,
) -> VllmLogs:
    """The last lines of the managed vLLM's log: where it says why it failed to start."""
    managed = state_of(ctx).vllm.managed
    return await anyio.to_thread.run_sync(partial(vllm_service.logs, managed, lines=lines))


async def vllm_reset_prefix_cache(ctx: Context[Any]) -> VllmResetOut:
    """Drop every block of vLLM's prefix cache, so the next call is cold (for before/after
    measurements). Needs a server started with VLLM_SERVER_DEV_MODE=1 (vllm_start with
    dev_mode=true); otherwise reset=false and the reason says so."""
    async with state_of(ctx).vllm.borrowed() as client:
        return await vllm_service.reset_prefix_cache(client)


async def vllm_trace_summary(
    ctx: Context[Any],
    path: Annotated[
        str | None,
        Field(
            description="A JSONL trace file (one Trace per line); default: this session's "
            "vllm_chat calls."
        ),
    ] = None,
) -> VllmTraceSummaryOut:
    """Summarize traces: average prefix-cache hit rate, tokens saved, an estimate of prefill
    seconds saved (from the run's own cold calls; its basis is stated), counts per cached-token
    source, p50/p95 latency."""
    access = state_of(ctx).vllm
    if path is None:
        return vllm_service.session_summary(access.traces)
    try:
        return await anyio.to_thread.run_sync(vllm_service.file_summary, Path(path))
    except FileNotFoundError:
        raise ToolError(f"no trace file at {path}; give the path of a JSONL trace file") from None
    except (OSError, InvalidValue) as exc:
        raise ToolError(f"cannot read {path}: {exc}") from exc


def _progress_reporter(ctx: Context[Any]) -> Progress:
    """A progress callback for the worker thread that forwards to the MCP client, in order."""
    last = [-1.0]

    def report(elapsed_s: float, total_s: float, message: str) -> None:
        if elapsed_s <= last[0]:
            elapsed_s = last[0] + 1e-3  # MCP progress must increase
        last[0] = elapsed_s
        anyio.from_thread.run(
            partial(ctx.report_progress, elapsed_s, total=total_s or None, message=message)
        )

    return report


SPECS = (
    ToolSpec(vllm_chat, "Chat with vLLM (with cache accounting)", CALLS_MODEL),
    ToolSpec(vllm_metrics, "vLLM prefix-cache metrics", READ_ONLY),
    ToolSpec(vllm_status, "Managed vLLM status", READ_ONLY),
    ToolSpec(vllm_logs, "Managed vLLM log tail", READ_ONLY),
    ToolSpec(vllm_trace_summary, "Summarize vLLM call traces", READ_ONLY),
    ToolSpec(vllm_start, "Start (or reuse) a vLLM server", STARTS_DOWNLOADING),
    ToolSpec(vllm_stop, "Stop the managed vLLM server", STOPS_PROCESS),
    ToolSpec(vllm_reset_prefix_cache, "Reset vLLM's prefix cache", RESETS_CACHE),
)


def register(server: MCPServer[Any], *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
