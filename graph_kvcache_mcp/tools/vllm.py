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
from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.kv_open import engine_environment
from graph_kvcache_mcp.connectors.trace_log import TraceFile, read_traces
from graph_kvcache_mcp.connectors.vllm_openai import VllmRequestError
from graph_kvcache_mcp.connectors.vllm_process import (
    Progress,
    VllmLogs,
    VllmStatus,
    VllmStopResult,
)
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.traces import Trace, TraceSummary, summarize
from graph_kvcache_mcp.domain.vllm_launch import KvConnector, VllmLaunch
from graph_kvcache_mcp.domain.vllm_metrics import (
    MetricsDelta,
    MetricsSnapshot,
    UnknownModel,
    delta,
)
from graph_kvcache_mcp.errors import ConfigError, InvalidValue, VllmProcessError
from graph_kvcache_mcp.services.vllm_restart_reuse import RestartReuseOut, measure_restart_reuse
from graph_kvcache_mcp.tools._common import (
    READ_ONLY,
    STARTS_PROCESS,
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
# A restart drops vLLM's prefix cache, and every run measures a new prompt: destructive, not
# idempotent.
RESTARTS_SERVER = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)
MAX_BAD_LINES_SHOWN = 50

Model = Annotated[
    str | None,
    Field(description="Served model name; default: VLLM_MODEL, else the server's only model."),
]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class VllmChatOut(BaseModel):
    """One call's answer and its cache accounting."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    base_url: str
    answer: str | None = None
    trace: Trace | None = Field(None, description="Tokens, cache hits and their source, latency.")
    reason: str | None = Field(None, description="Why vLLM could not answer.")


class VllmMetricsOut(BaseModel):
    """A /metrics snapshot, or what moved since an earlier one."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    metrics_url: str
    snapshot: MetricsSnapshot | None = None
    delta: MetricsDelta | None = Field(None, description="Present when `since` was given.")
    reason: str | None = None


class VllmStatusOut(VllmStatus):
    tools_base_url: str = Field(description="Where vllm_chat and vllm_metrics send requests now.")


class VllmResetOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    reachable: bool
    reset: bool = False
    dev_mode: bool | None = None
    reason: str | None = None


class VllmTraceSummaryOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: Literal["file", "session"]
    path: str | None = None
    summary: TraceSummary
    bad_line_count: int = 0
    bad_lines: list[int] = Field(
        default_factory=list, description=f"First {MAX_BAD_LINES_SHOWN} lines that were not traces."
    )


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
    conversation = _conversation(message, system, messages)
    client = await access.client()
    try:
        result = await client.chat(
            conversation,
            model=model or access.settings.vllm_model,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
        )
    except VllmRequestError as exc:
        raise ToolError(f"{exc}. Fix the request and call vllm_chat again.") from exc
    if isinstance(result, Unavailable):
        return VllmChatOut(reachable=False, base_url=client.base_url, reason=result.reason)
    access.traces.append(result.trace)
    return VllmChatOut(
        reachable=True, base_url=client.base_url, answer=result.answer, trace=result.trace
    )


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
    client = await access.client()
    try:
        snapshot = await client.metrics.snapshot(model or access.settings.vllm_model)
    except UnknownModel as exc:
        raise ToolError(f"{exc}. Call vllm_metrics again with one of those models.") from exc
    url = client.metrics.metrics_url
    if isinstance(snapshot, Unavailable):
        return VllmMetricsOut(reachable=False, metrics_url=url, reason=snapshot.reason)
    window = delta(since, snapshot) if since is not None else None
    return VllmMetricsOut(reachable=True, metrics_url=url, snapshot=snapshot, delta=window)


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
    kv_connector: Annotated[
        KvConnector,
        Field(
            description="External KV tier: 'engine' (EngineKVConnector, CPU vLLM: KV survives "
            "restarts and is shared between instances), an LMCache mode of lmcache_config, or "
            "'none'."
        ),
    ] = "none",
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
            kv_connector=kv_connector,
            extra_args=tuple(extra_args or ()),
        )
        env = engine_environment(access.settings) if launch.needs_engine_environment else None
        status = await anyio.to_thread.run_sync(
            partial(
                access.managed.start,
                launch,
                env=env,
                ready_timeout_s=ready_timeout_s,
                progress=_progress_reporter(ctx),
            )
        )
    except (VllmProcessError, ConfigError) as exc:
        raise ToolError(str(exc)) from exc
    if status.base_url is not None:
        await access.use(status.base_url)
    return VllmStatusOut(**status.model_dump(), tools_base_url=access.base_url)


async def vllm_stop(
    ctx: Context[Any],
    wait_s: Annotated[float, Field(gt=0, le=120, description="SIGTERM grace before SIGKILL.")] = 15,
) -> VllmStopResult:
    """Stop the vLLM server this project started from its data dir: SIGTERM to its process group,
    SIGKILL after `wait_s`. A server this project did not start is never signalled (the result
    says not_running). Its prefix cache is lost."""
    managed = state_of(ctx).vllm.managed
    return await anyio.to_thread.run_sync(partial(managed.stop, term_wait_s=wait_s))


async def vllm_status(ctx: Context[Any]) -> VllmStatusOut:
    """Report the managed vLLM (pid, port, model, platform and flag notes, uptime, log path) and
    whether it answers; without one, whether anything answers on the configured port."""
    access = state_of(ctx).vllm
    status = await anyio.to_thread.run_sync(partial(access.managed.status, port=access.port))
    return VllmStatusOut(**status.model_dump(), tools_base_url=access.base_url)


async def vllm_logs(
    ctx: Context[Any],
    lines: Annotated[int, Field(ge=1, le=500, description="How many last lines.")] = 50,
) -> VllmLogs:
    """The last lines of the managed vLLM's log: where it says why it failed to start."""
    managed = state_of(ctx).vllm.managed
    return await anyio.to_thread.run_sync(partial(managed.logs, lines))


async def vllm_reset_prefix_cache(ctx: Context[Any]) -> VllmResetOut:
    """Drop every block of vLLM's prefix cache, so the next call is cold (for before/after
    measurements). Needs a server started with VLLM_SERVER_DEV_MODE=1 (vllm_start with
    dev_mode=true); otherwise reset=false and the reason says so."""
    client = await state_of(ctx).vllm.client()
    result = await client.reset_prefix_cache()
    if isinstance(result, Unavailable):
        return VllmResetOut(reachable=False, reason=result.reason)
    return VllmResetOut(
        reachable=True, reset=result.reset, dev_mode=result.dev_mode, reason=result.reason
    )


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
        return VllmTraceSummaryOut(source="session", summary=summarize(list(access.traces)))
    try:
        found = await anyio.to_thread.run_sync(_read_trace_file, path)
    except FileNotFoundError:
        raise ToolError(f"no trace file at {path}; give the path of a JSONL trace file") from None
    except (OSError, InvalidValue) as exc:
        raise ToolError(f"cannot read {path}: {exc}") from exc
    return VllmTraceSummaryOut(
        source="file",
        path=found.path,
        summary=summarize(found.traces),
        bad_line_count=len(found.bad_lines),
        bad_lines=found.bad_lines[:MAX_BAD_LINES_SHOWN],
    )


def _read_trace_file(path: str) -> TraceFile:
    return read_traces(Path(path).expanduser())


def _conversation(
    message: str | None, system: str | None, messages: list[ChatMessage] | None
) -> list[dict[str, str]]:
    if messages is not None and (message is not None or system is not None):
        raise ToolError("give either `messages`, or `message` (with an optional `system`)")
    if messages:
        return [turn.model_dump() for turn in messages]
    if not message:
        raise ToolError("nothing to send: give `message` (the user turn) or `messages`")
    turns = [{"role": "system", "content": system}] if system else []
    return [*turns, {"role": "user", "content": message}]


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


async def vllm_restart_reuse(
    ctx: Context[Any],
    prompt_tokens: Annotated[
        int, Field(ge=64, le=131072, description="About how long the test prompt is, in tokens.")
    ] = 2048,
    ready_timeout_s: Annotated[
        float, Field(gt=0, le=3600, description="How long the restarted vLLM may take.")
    ] = 600.0,
) -> RestartReuseOut:
    """Measure KV reuse across a vLLM restart through the engine: on the managed vLLM started
    with kv_connector='engine', send a long prompt with a fresh nonce (cold), restart vLLM, send
    it again. Returns both calls' time to first token, cached tokens and the part loaded from
    the engine (external hits), the TTFT speed-up and the engine bytes stored and loaded. The
    restart drops vLLM's own prefix cache and takes as long as a start."""
    access = state_of(ctx).vllm
    settings = access.settings
    try:
        return await measure_restart_reuse(
            access.managed,
            settings,
            prompt_tokens=prompt_tokens,
            env=engine_environment(settings),
            ready_timeout_s=ready_timeout_s,
            progress=_progress_reporter(ctx),
        )
    except (VllmProcessError, ConfigError) as exc:
        raise ToolError(str(exc)) from exc


SPECS = (
    ToolSpec(vllm_chat, "Chat with vLLM (with cache accounting)", READ_ONLY),
    ToolSpec(vllm_metrics, "vLLM prefix-cache metrics", READ_ONLY),
    ToolSpec(vllm_status, "Managed vLLM status", READ_ONLY),
    ToolSpec(vllm_logs, "Managed vLLM log tail", READ_ONLY),
    ToolSpec(vllm_trace_summary, "Summarize vLLM call traces", READ_ONLY),
    ToolSpec(vllm_start, "Start (or reuse) a vLLM server", STARTS_PROCESS),
    ToolSpec(vllm_stop, "Stop the managed vLLM server", STOPS_PROCESS),
    ToolSpec(vllm_reset_prefix_cache, "Reset vLLM's prefix cache", RESETS_CACHE),
    ToolSpec(vllm_restart_reuse, "Measure KV reuse across a vLLM restart", RESTARTS_SERVER),
)


def register(server: MCPServer[Any], *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
