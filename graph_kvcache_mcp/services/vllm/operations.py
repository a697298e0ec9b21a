"""vLLM operations shared by the `vllm_*` tools and `graph-kvcache-mcp vllm ...`.

Each returns the one model its tool returns and its command prints (`services.vllm.views`).
The caller brings the client (the server's shared one, or the command's own) or the managed
server; calls that block (process lifecycle, files) are plain functions a tool runs in a thread.
The vLLM client is only a type here: openai loads when a client is first made, not with this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from graph_kvcache_mcp.connectors.files.trace_log import read_traces
from graph_kvcache_mcp.connectors.vllm.metrics import final_snapshots
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm, WaitProgress
from graph_kvcache_mcp.connectors.vllm.state import VllmLogs, VllmStopResult
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters, counters_moved
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.chat import DEFAULT_MAX_TOKENS, window_tiers
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot, restarted, window
from graph_kvcache_mcp.domain.vllm.traces import Trace, summarize
from graph_kvcache_mcp.errors import InvalidValue
from graph_kvcache_mcp.services.vllm.engine_death import status_with_death
from graph_kvcache_mcp.services.vllm.views import (
    MAX_BAD_LINES_SHOWN,
    VllmChatOut,
    VllmMetricsOut,
    VllmResetOut,
    VllmStatusOut,
    VllmTraceSummaryOut,
)

if TYPE_CHECKING:
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient


def conversation(
    message: str | None, system: str | None, turns: Sequence[ChatMessage] | None
) -> list[ChatMessage]:
    """The messages of one call: `turns` as given, or [system?, user(message)].

    Raises:
        InvalidValue: both forms given, or nothing to send.
    """
    if turns is not None and (message is not None or system is not None):
        raise InvalidValue("give either `messages`, or `message` (with an optional `system`)")
    if turns:
        return list(turns)
    if not message:
        raise InvalidValue("nothing to send: give `message` (the user turn) or `messages`")
    first = [ChatMessage(role="system", content=system)] if system else []
    return [*first, ChatMessage(role="user", content=message)]


async def chat(
    client: VllmClient,
    messages: Sequence[ChatMessage],
    *,
    model: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    stream: bool = False,
) -> VllmChatOut:
    """One chat call: the answer and its trace, or reachable=false with the reason.

    Raises:
        VllmRequestError: vLLM refused the request (unknown model, prompt too long, ...).
    """
    result = await client.chat(
        messages, model=model, max_tokens=max_tokens, temperature=temperature, stream=stream
    )
    return VllmChatOut.from_result(client.base_url, result)


async def metrics(
    client: VllmClient,
    model: str | None = None,
    since: MetricsSnapshot | None = None,
    *,
    data_dir: Path | None = None,
    since_lmcache: LmcacheCounters | None = None,
) -> VllmMetricsOut:
    """A /metrics snapshot for `model` (None: all models summed), and the delta from `since`,
    counted across the managed restarts of `data_dir`'s vLLM (their final counts recorded),
    split by tier (with `since_lmcache`, the lmcache server's counters then, into L1 and L2).

    Raises:
        UnknownModel: the server reports no series for `model`.
    """
    url = client.metrics.metrics_url
    snapshot = await client.metrics.snapshot(model)
    if isinstance(snapshot, Unavailable):
        return VllmMetricsOut(reachable=False, metrics_url=url, reason=snapshot.reason)
    tier = client.meter.tier
    counters = await tier.read() if tier is not None else None
    lmcache = None if isinstance(counters, Unavailable) else counters
    moved = tiers = None
    if since is not None:
        finals = []
        if data_dir is not None and restarted(since, snapshot):
            finals = await anyio.to_thread.run_sync(final_snapshots, data_dir, model)
        moved = window(since, snapshot, finals)
        lmcache_moved = None
        if since_lmcache is not None and lmcache is not None:
            lmcache_moved = counters_moved(since_lmcache, lmcache)
        tiers = window_tiers(moved, lmcache_moved)
    return VllmMetricsOut(
        reachable=True,
        metrics_url=url,
        snapshot=snapshot,
        delta=moved,
        lmcache=lmcache,
        tiers=tiers,
    )


async def reset_prefix_cache(client: VllmClient) -> VllmResetOut:
    """Drop vLLM's prefix cache; reset=false (and why) without dev mode."""
    return VllmResetOut.from_result(await client.reset_prefix_cache())


def start(
    managed: ManagedVllm,
    launch: VllmLaunch,
    *,
    ready_timeout_s: float,
    progress: WaitProgress | None = None,
    calls_base_url: str,
    env: Mapping[str, str] | None = None,
) -> VllmStatusOut:
    """Ensure a vLLM runs as `launch` asks (reusing a healthy one); blocks until it answers.

    `tools_base_url` is the server's own URL (the caller then points its calls at it), else
    `calls_base_url`, where calls went before. `env` is added to vLLM's environment (the
    engine's URL and token for the engine KV connector).

    Raises:
        VllmProcessError: it could not be started (the log's telling line says why).
        ConfigError: the launch cannot work here (no vLLM in the interpreter, bad flags).
    """
    status = managed.start(launch, env=env, ready_timeout_s=ready_timeout_s, progress=progress)
    return VllmStatusOut.of(status, status.base_url or calls_base_url)


def status(managed: ManagedVllm, *, port: int, tools_base_url: str) -> VllmStatusOut:
    """The managed vLLM (or whatever answers on `port`) and where calls go now."""
    return status_with_death(VllmStatusOut.of(managed.status(port=port), tools_base_url), managed)


def stop(managed: ManagedVllm, *, wait_s: float) -> VllmStopResult:
    """Stop the vLLM this data dir started: SIGTERM to its group, SIGKILL after `wait_s`."""
    return managed.stop(term_wait_s=wait_s)


def logs(managed: ManagedVllm, *, lines: int) -> VllmLogs:
    """The last `lines` of the managed vLLM's log."""
    return managed.logs(max(1, lines))


def session_summary(traces: Iterable[Trace]) -> VllmTraceSummaryOut:
    """The summary of this session's calls."""
    return VllmTraceSummaryOut(source="session", summary=summarize(list(traces)))


def file_summary(path: Path) -> VllmTraceSummaryOut:
    """The summary of a JSONL trace file, and which lines were not traces.

    Raises:
        FileNotFoundError: there is no file at `path`.
        InvalidValue: the file is too large.
        OSError: it cannot be read.
    """
    found = read_traces(path.expanduser())
    return VllmTraceSummaryOut(
        source="file",
        path=found.path,
        summary=summarize(found.traces),
        bad_line_count=len(found.bad_lines),
        bad_lines=found.bad_lines[:MAX_BAD_LINES_SHOWN],
    )
