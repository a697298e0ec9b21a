"""Say that the managed vLLM's engine died, where a status or a call would only say "not
running" or "HTTP 500": the worker death in its log since our last start (signal, time, the frame
it died in, the last scheduler stats), and what to do about it."""

from __future__ import annotations

from pathlib import Path

import anyio.to_thread

from graph_kvcache_mcp.connectors.vllm.health import read_worker_death
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint
from graph_kvcache_mcp.domain.vllm.worker_death import WorkerDeath
from graph_kvcache_mcp.services.stack.views import VllmStatusOut
from graph_kvcache_mcp.services.vllm.views import VllmChatOut


def death_reason(death: WorkerDeath) -> str:
    """One sentence for a `reason` field: what happened, when, and what to do."""
    return f"the engine died: {death.what_happened} (at {death.at}). {death.what_to_do}"


def managed_death(managed: ManagedVllm, base_url: str | None = None) -> WorkerDeath | None:
    """The managed vLLM's worker death since its last start; None when it has none, or when
    `base_url` is another server than the one this data dir started (its record says)."""
    recorded = managed.state()
    if (
        base_url is not None
        and recorded is not None
        and VllmEndpoint.of(recorded.base_url) != VllmEndpoint.of(base_url)
    ):
        return None
    return read_worker_death(managed.log_path)


def data_dir_death(data_dir: Path, base_url: str | None = None) -> WorkerDeath | None:
    """`managed_death` for the vLLM the data dir `data_dir` records (a read-only handle)."""
    return managed_death(ManagedVllm(data_dir, tidy=False), base_url)


def status_with_death(status: VllmStatusOut, managed: ManagedVllm) -> VllmStatusOut:
    """`status`, with the worker death that explains a vLLM that is down or does not answer."""
    if status.running and status.reachable:
        return status
    death = managed_death(managed)
    if death is None:
        return status
    return status.model_copy(update={"worker_death": death, "reason": death_reason(death)})


async def chat_with_death(out: VllmChatOut, managed: ManagedVllm) -> VllmChatOut:
    """`out`, whose reason names the engine's death when the call failed because of one."""
    if out.reachable:
        return out
    death = await anyio.to_thread.run_sync(managed_death, managed, out.base_url)
    if death is None:
        return out
    return out.model_copy(update={"reason": f"{death_reason(death)} (the call: {out.reason})"})
