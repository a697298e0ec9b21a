"""vLLM tools (vllm_*): chat with cache accounting, /metrics, the managed server, trace summary."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from graph_kvcache_mcp.connectors.vllm.state import VllmLogs, VllmStopResult
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.lifecycle import LogLines, ReadyTimeout, ServicePort, StopWait
from graph_kvcache_mcp.domain.lmcache.stack import Coordinator, StackOptions
from graph_kvcache_mcp.domain.vllm.chat import AnswerTokens, Temperature
from graph_kvcache_mcp.domain.vllm.deadlines import CALL_TIMEOUT_ENV, PROBE_TIMEOUT_ENV
from graph_kvcache_mcp.domain.vllm.launch import (
    BlockSize,
    GpuMemoryUtilization,
    KvCacheBytes,
    KvConnector,
    MaxModelLen,
    VllmLaunch,
)
from graph_kvcache_mcp.domain.vllm.metrics import UnknownModel
from graph_kvcache_mcp.errors import (
    ConfigError,
    EngineProcessError,
    FileRefused,
    InvalidValue,
    LmcacheProcessError,
    VllmProcessError,
    VllmRequestError,
)
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.stack.engine_death import chat_with_death
from graph_kvcache_mcp.services.stack.lifetime import LeasedToSession
from graph_kvcache_mcp.services.stack.stack import Stack
from graph_kvcache_mcp.services.stack.start import WaitProgress, start_vllm
from graph_kvcache_mcp.services.vllm import operations as vllm_service
from graph_kvcache_mcp.services.vllm.restart_reuse import (
    RestartMode,
    RestartReuseOut,
    ReusePromptTokens,
    measure_restart_reuse,
)
from graph_kvcache_mcp.services.vllm.views import (
    VllmChatOut,
    VllmMetricsOut,
    VllmResetOut,
    VllmStatusOut,
    VllmTraceSummaryOut,
)
from graph_kvcache_mcp.state import VllmBaseline
from graph_kvcache_mcp.tools._common import (
    CALLS_MODEL,
    READ_ONLY,
    STOPS_PROCESS,
    ServedModel,
    ToolSpec,
    register_all,
    snapshot_since,
    state_of,
)
from graph_kvcache_mcp.tools.file_paths import path_inside_roots
from graph_kvcache_mcp.tools.progress import with_progress

TOOLSET = "vllm"
# Dropping the prefix cache changes what later calls cost, so it is a destructive write.
RESETS_CACHE = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)
# vllm_start accepts a hub id, which vLLM then downloads: it may reach beyond this machine.
STARTS_DOWNLOADING = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
)
# A restart drops vLLM's prefix cache, and every run measures a new prompt: destructive, not
# idempotent.
RESTARTS_SERVER = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)

Model = ServedModel


async def vllm_chat(
    ctx: Context[Any],
    message: Annotated[str | None, Field(description="The user turn (or give messages).")] = None,
    system: Annotated[str | None, Field(description="System message sent before message.")] = None,
    messages: Annotated[
        list[ChatMessage] | None,
        Field(description="A whole conversation instead."),
    ] = None,
    model: Model = None,
    max_tokens: Annotated[AnswerTokens, Field(description="Answer length cap.")] = 64,
    temperature: Annotated[Temperature, Field(description="0 = greedy (repeatable).")] = 0.0,
    stream: Annotated[bool, Field(description="Stream, to measure TTFT.")] = False,
) -> VllmChatOut:
    """One chat request to vLLM: the answer and a trace (prompt tokens, prefix_cache_hit_tokens,
    cached_tokens_source: where that count came from, null = unknown; latency; TTFT when
    streamed)."""
    access = state_of(ctx).vllm
    try:
        conversation = vllm_service.conversation(message, system, messages)
        async with access.borrowed() as client:
            call = partial(
                vllm_service.chat,
                client,
                conversation,
                model=model or access.settings.vllm_model,
                max_tokens=max_tokens,
                temperature=temperature,
                stream=stream,
            )
            # The model lookup and the /metrics read before the call are probes; then the call.
            bound_s = client.timeout_s + 2 * client.probe_timeout_s
            out = await with_progress(
                ctx,
                call,
                what=f"vLLM chat at {client.root_url}",
                bound_s=bound_s,
                knob=CALL_TIMEOUT_ENV,
            )
        out = await chat_with_death(out, access.managed)
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
        str | None,
        Field(description="snapshot_id of an earlier result: adds `delta`."),
    ] = None,
) -> VllmMetricsOut:
    """vLLM /metrics for one model: prefix-cache queries, hits, hit rate, connector hits, prompt
    tokens by source, KV usage, queue, TTFT, cache config (null = not exported). Pass its
    snapshot_id as since for a delta."""
    state = state_of(ctx)
    before = None if since is None else snapshot_since(state.vllm_snapshots, since, "vllm_metrics")
    access = state.vllm
    try:
        async with access.borrowed() as client:
            scrape = partial(
                vllm_service.metrics,
                client,
                model or access.settings.vllm_model,
                before.vllm if before else None,
                data_dir=access.settings.data_dir,
                since_lmcache=before.lmcache if before else None,
            )
            out = await with_progress(
                ctx,
                scrape,
                what=f"vLLM /metrics at {client.root_url}",
                bound_s=client.probe_timeout_s,
                knob=PROBE_TIMEOUT_ENV,
            )
    except UnknownModel as exc:
        raise ToolError(f"{exc}. Call vllm_metrics again with one of those models.") from exc
    if out.snapshot is None:
        return out
    kept = VllmBaseline(vllm=out.snapshot, lmcache=out.lmcache)
    return out.model_copy(update={"snapshot_id": state.vllm_snapshots.keep(kept)})


CoordinatorArg = Annotated[Coordinator | None, Field(description="'managed' or a URL.")]


async def vllm_start(
    ctx: Context[Any],
    model: Annotated[str, Field(min_length=1, description="Local model dir or hub id.")],
    port: Annotated[
        ServicePort | None, Field(description="Loopback port; default: VLLM_BASE_URL's.")
    ] = None,
    served_model_name: Annotated[
        str | None, Field(description="Name clients use; default: `model`.")
    ] = None,
    max_model_len: Annotated[MaxModelLen | None, Field(description="Context length cap.")] = None,
    dtype: Annotated[str, Field(description="auto, bfloat16, float16, float32.")] = "auto",
    gpu_memory_utilization: Annotated[
        GpuMemoryUtilization | None, Field(description="GPU only; default 0.9.")
    ] = None,
    block_size: Annotated[
        BlockSize | None, Field(description="KV block size; CPU needs a multiple of 32.")
    ] = None,
    kv_cache_memory_bytes: Annotated[
        KvCacheBytes | None, Field(description="KV cache size; CPU default 1 GiB.")
    ] = None,
    dev_mode: Annotated[bool, Field(description="Needed by vllm_reset_prefix_cache.")] = False,
    extra_args: Annotated[list[str] | None, Field(description="More vLLM flags.")] = None,
    kv_connector: Annotated[
        KvConnector,
        Field(description="External KV tier: engine (CPU), an LMCache mode, or none."),
    ] = "none",
    kv_events: Annotated[bool, Field(description="Publish KV events (fleet_* tools).")] = False,
    ready_timeout_s: Annotated[
        ReadyTimeout, Field(description="Stop it if not healthy by then.")
    ] = 600.0,
    coordinator: CoordinatorArg = None,
) -> VllmStatusOut:
    """Start (or reuse) a prefix-caching loopback vLLM; returns once healthy; outlives this
    server. mp_native/redis_resp start the engine and lmcache server first."""
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
            kv_connector=kv_connector,
            kv_events=kv_events,
            lmcache_port=access.settings.lmcache_port,
            extra_args=tuple(extra_args or ()),
        )
        out = await _launch(ctx, launch, ready_timeout_s, coordinator)
    except (VllmProcessError, LmcacheProcessError, EngineProcessError, ConfigError) as exc:
        raise ToolError(str(exc)) from exc
    await access.use(out.tools_base_url)
    return out


async def _launch(
    ctx: Context[Any], launch: VllmLaunch, ready_timeout_s: float, coordinator: str | None
) -> VllmStatusOut:
    """vLLM alone, or (an MP LMCache connector) the stack under it first, leased by this
    session."""
    state = state_of(ctx)
    options = StackOptions(http_port=state.settings.lmcache_http_port, coordinator=coordinator)
    return await start_vllm(
        state.settings,
        launch,
        LeasedToSession(kv=state.kv, lmcache=state.lmcache),
        options=options,
        ready_timeout_s=ready_timeout_s,
        progress=_progress_reporter(ctx),
        calls_base_url=state.vllm.base_url,
        managed=state.vllm.managed,
    )


async def vllm_stop(
    ctx: Context[Any],
    wait_s: Annotated[StopWait, Field(description="SIGTERM grace before SIGKILL.")] = 15,
) -> VllmStopResult:
    """Stop the vLLM this project started (SIGTERM, then SIGKILL after wait_s); never
    another. Its prefix cache is lost."""
    access = state_of(ctx).vllm
    stack = Stack.of(access.settings, vllm=access.managed)
    return await anyio.to_thread.run_sync(partial(stack.stop_vllm, access.base_url, wait_s=wait_s))


async def vllm_status(ctx: Context[Any]) -> VllmStatusOut:
    """The managed vLLM (pid, port, model, notes, uptime, log) and whether it answers;
    else whether anything answers on the configured port."""
    access = state_of(ctx).vllm
    stack = Stack.of(access.settings, vllm=access.managed)
    return await anyio.to_thread.run_sync(stack.vllm_status, access.base_url)


async def vllm_logs(
    ctx: Context[Any],
    lines: Annotated[LogLines, Field(description="How many last lines.")] = 50,
) -> VllmLogs:
    """The last lines of the managed vLLM's log (why it failed to start)."""
    access = state_of(ctx).vllm
    stack = Stack.of(access.settings, vllm=access.managed)
    read = partial(stack.vllm_logs, access.base_url, lines=lines)
    try:
        return await anyio.to_thread.run_sync(read)
    except (VllmProcessError, ConfigError) as exc:  # a vLLM we did not start: not ours to read
        raise ToolError(str(exc)) from exc


async def vllm_reset_prefix_cache(ctx: Context[Any]) -> VllmResetOut:
    """Drop vLLM's whole prefix cache so the next call is cold. Needs vllm_start dev_mode=true; else
    reset=false with the reason."""
    async with state_of(ctx).vllm.borrowed() as client:
        return await vllm_service.reset_prefix_cache(client)


async def vllm_trace_summary(
    ctx: Context[Any],
    path: Annotated[
        str | None,
        Field(
            description="A JSONL trace file (absolute, in the allowed roots); default: this "
            "session's vllm_chat calls."
        ),
    ] = None,
) -> VllmTraceSummaryOut:
    """Summarize this session's chat traces, or a JSONL trace file: hit rate, tokens and
    estimated prefill seconds saved, counts per cached-token source, p50/p95 latency."""
    access = state_of(ctx).vllm
    if path is None:
        return vllm_service.session_summary(access.traces)
    resolved = await path_inside_roots(ctx, path, param="path")
    try:
        return await anyio.to_thread.run_sync(vllm_service.file_summary, resolved)
    except FileRefused as exc:
        raise ToolError(f"no trace file at {path}: {exc}; give a JSONL trace file") from None
    except (OSError, InvalidValue) as exc:
        raise ToolError(f"cannot read {path}: {exc}") from exc


def _progress_reporter(ctx: Context[Any]) -> WaitProgress:
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


async def vllm_restart_reuse(
    ctx: Context[Any],
    prompt_tokens: Annotated[
        ReusePromptTokens, Field(description="About how long the test prompt is, in tokens.")
    ] = 2048,
    ready_timeout_s: Annotated[
        ReadyTimeout, Field(description="How long the restarted vLLM may take.")
    ] = 600.0,
    restart: Annotated[RestartMode, Field(description="stack: the lmcache server too.")] = "vllm",
) -> RestartReuseOut:
    """Managed vLLM with a KV tier (kv_connector engine, mp_native, redis_resp): a long prompt cold,
    a restart, the same prompt again; both TTFTs, cached tokens by tier, engine bytes."""
    access = state_of(ctx).vllm
    settings = access.settings
    try:
        return await measure_restart_reuse(
            Stack.of(settings, vllm=access.managed),
            access.base_url,
            prompt_tokens=prompt_tokens,
            ready_timeout_s=ready_timeout_s,
            progress=_progress_reporter(ctx),
            mode=restart,
        )
    except (VllmProcessError, LmcacheProcessError, ConfigError) as exc:
        raise ToolError(str(exc)) from exc


SPECS = (
    ToolSpec(vllm_chat, "Chat with vLLM (with cache accounting)", CALLS_MODEL),
    ToolSpec(vllm_metrics, "vLLM prefix-cache metrics", READ_ONLY),
    ToolSpec(vllm_status, "Managed vLLM status", READ_ONLY),
    ToolSpec(vllm_logs, "Managed vLLM log tail", READ_ONLY),
    ToolSpec(vllm_trace_summary, "Summarize vLLM call traces", READ_ONLY),
    ToolSpec(vllm_start, "Start (or reuse) a vLLM server", STARTS_DOWNLOADING),
    ToolSpec(vllm_stop, "Stop the managed vLLM server", STOPS_PROCESS),
    ToolSpec(vllm_reset_prefix_cache, "Reset vLLM's prefix cache", RESETS_CACHE),
    ToolSpec(vllm_restart_reuse, "Measure KV reuse across a vLLM restart", RESTARTS_SERVER),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
