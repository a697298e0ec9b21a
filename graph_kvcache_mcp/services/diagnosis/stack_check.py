"""`diagnose stack`: reach every component, gather what each reports, and turn it into findings.

Nothing is started: an engine that is not running is reported, never launched. vLLM gets one
probe call (one token) to see whether its usage carries prompt_tokens_details. LMCache is checked
at `lmcache_url`, else the configured server (`GRAPH_KVCACHE_LMCACHE_URL`), else the managed
`lmcache server` of the data dir when one runs. For the processes this data dir started, their
recorded wiring, the two names of their environments that matter (PYTHONHASHSEED,
LMCACHE_MP_TRANSFER_MODE) and the server's log are read too, and the managed vLLM's log for a
worker that died since its last start. Of a component it did not start (a configured one, or
one on loopback that something else runs) only its own API is read (an lmcache server's /config
tells its transfer mode and port); what lives with its process is named as not readable here
(`not_readable`), never guessed. Shared by the `diagnose_stack` tool and the `diagnose stack`
CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target, sync_client_for
from graph_kvcache_mcp.connectors.files.hf_config import local_model_config
from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHealth, LmcacheHttp
from graph_kvcache_mcp.connectors.vllm.platform import detect_platform
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.diagnosis.stack_findings import (
    EngineFacts,
    LmcacheFacts,
    StackDiagnosis,
    VllmFacts,
    stack_findings,
)
from graph_kvcache_mcp.domain.endpoints import approve_http_url
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.targets import Configured, facts_not_readable_here
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint
from graph_kvcache_mcp.domain.vllm.hybrid.launch import HybridRun, hybrid_run
from graph_kvcache_mcp.domain.vllm.metrics import UnknownModel, count_preemptions, parse_snapshot
from graph_kvcache_mcp.errors import VllmRequestError
from graph_kvcache_mcp.services.stack.engine_death import data_dir_death
from graph_kvcache_mcp.services.stack.runtime import (
    LmcacheRuntime,
    ManagedRuntime,
    leaked_lmcache_segments,
    lmcache_target,
    managed_lmcache_runtime,
    managed_lmcache_url,
    managed_vllm_record,
    managed_vllm_runtime,
)

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient

PROBE = [ChatMessage(role="user", content="ping")]
VLLM_HIDDEN = "KV connector, PYTHONHASHSEED, LMCACHE_MP_TRANSFER_MODE, platform and log"
LMCACHE_HIDDEN = "PYTHONHASHSEED and log (a registration it cannot serve, a lost RESP engine)"


async def check_stack(
    settings: Settings,
    vllm: VllmClient,
    *,
    model: str | None = None,
    lmcache_url: str | None = None,
    shared_prefix_tokens: int | None = None,
    server_manages_engine: bool = False,
) -> StackDiagnosis:
    """Findings for the engine, the vLLM `vllm` talks to, and LMCache when `lmcache_url` is given.

    `server_manages_engine`: the caller (an MCP server with nothing configured) runs its own
    engine on first use, so with none running yet "the engine" is that one, not the library's
    fallback address.

    Raises:
        ConfigError: an LMCache URL that cannot be used.
    """
    if lmcache_url is not None:  # before any I/O: a refused URL is the caller's mistake
        lmcache_url = approve_http_url(
            lmcache_url, what="lmcache_url", insecure_hosts=settings.insecure_http_hosts
        ).url
    elif isinstance(server := lmcache_target(settings), Configured):
        lmcache_url = server.url
    else:
        lmcache_url = await anyio.to_thread.run_sync(managed_lmcache_url, settings.data_dir)
    engine = await engine_facts(settings, server_manages_engine=server_manages_engine)
    served = await vllm_facts(settings, vllm, model=model, shared=shared_prefix_tokens)
    death = await anyio.to_thread.run_sync(data_dir_death, settings.data_dir, vllm.base_url)
    served = served.model_copy(update={"worker_death": death})
    lmcache = None if lmcache_url is None else await lmcache_facts(lmcache_url, settings.data_dir)
    return stack_findings(engine, served, lmcache)


async def engine_facts(settings: Settings, *, server_manages_engine: bool = False) -> EngineFacts:
    if problem := settings.endpoint_problem("kv"):  # refused at startup: never contacted
        return EngineFacts(
            target=settings.kv_url or "", source="configured", reachable=False, reason=problem
        )
    target = await anyio.to_thread.run_sync(resolve_kv_target, settings)
    if target.source == "default" and server_manages_engine:
        return EngineFacts(
            target=f"managed engine in {settings.data_dir}",
            source="default",
            reachable=False,
            reason="not started yet: this server starts it on first KV use or engine_start",
        )
    client = KvClient(sync_client_for(target, settings))
    try:
        stats = await client.engine_stats()
    finally:
        await client.aclose()
    if isinstance(stats, Unavailable):
        return EngineFacts(
            target=target.base_url,
            source=target.source,
            # a 4xx is an answer (e.g. a refused token); no status or a 5xx is not
            reachable=stats.status is not None and stats.status < 500,
            status=stats.status,
            reason=stats.reason,
        )
    return EngineFacts(
        target=target.base_url, source=target.source, reachable=True, backend=stats.backend
    )


async def vllm_facts(
    settings: Settings, client: VllmClient, *, model: str | None, shared: int | None
) -> VllmFacts:
    target = client.base_url
    if problem := settings.endpoint_problem("vllm"):  # refused at startup: never contacted
        return VllmFacts(target=target, reachable=False, reason=problem)
    health = await client.health()
    if isinstance(health, Unavailable):
        return VllmFacts(target=target, reachable=False, reason=health.reason)
    chosen = await client.resolve_model(model or settings.vllm_model)
    if isinstance(chosen, Unavailable):
        return VllmFacts(target=target, reachable=False, reason=chosen.reason)
    # Metrics first, so the probe call's own lookups never count as evidence.
    text = await client.metrics.scrape_text()
    if isinstance(text, Unavailable):
        return VllmFacts(target=target, reachable=False, reason=text.reason, model=chosen)
    try:
        try:
            snapshot = await anyio.to_thread.run_sync(parse_snapshot, text, chosen)
        except UnknownModel:  # no series for it yet: the server-wide figures still tell
            snapshot = await anyio.to_thread.run_sync(parse_snapshot, text, None)
        preemptions = count_preemptions(text, chosen)
    except ValueError as exc:
        return VllmFacts(target=target, reachable=False, reason=str(exc), model=chosen)
    try:
        probe = await client.chat(PROBE, model=chosen, max_tokens=1)
    except VllmRequestError as exc:
        probe = Unavailable(f"the probe call was refused: {exc}")
    details = (
        None if isinstance(probe, Unavailable) else probe.trace.cached_tokens_source == "usage"
    )
    version = await client.routes.version()
    runtime = await anyio.to_thread.run_sync(managed_vllm_runtime, settings.data_dir)
    if runtime is not None and VllmEndpoint.of(runtime.base_url) != client.endpoint:
        runtime = None  # the managed server is another one than the one checked
    # Not the managed one: a vLLM something else runs, whose process facts are not ours to read.
    hidden = None if runtime else facts_not_readable_here(Configured("vLLM", target), VLLM_HIDDEN)
    hybrid = await anyio.to_thread.run_sync(_hybrid_served, settings.data_dir, runtime, chosen)
    return VllmFacts(
        target=target,
        reachable=True,
        model=chosen,
        version=None if isinstance(version, Unavailable) else version,
        cache_config=snapshot.cache_config,
        prompt_tokens_details=details,
        kv_cache_usage=snapshot.kv_cache_usage_perc,
        preemptions=preemptions,
        external_queries=snapshot.external_prefix_cache_queries_tokens,
        external_hits=snapshot.external_prefix_cache_hits_tokens,
        prefix_hits=snapshot.prefix_cache_hits_tokens,
        shared_prefix_tokens=shared,
        kv_connector=None if runtime is None else runtime.kv_connector,
        hash_seed=None if runtime is None else runtime.hash_seed,
        platform=None if runtime is None else runtime.platform,
        hybrid=hybrid,
        lmcache_target=None if runtime is None else runtime.lmcache_target,
        lmcache_target_answers=None if runtime is None else runtime.lmcache_target_answers,
        lmcache_transfer_mode=None if runtime is None else runtime.lmcache_transfer_mode,
        not_readable=hidden,
    )


def _hybrid_served(data_dir: Path, runtime: ManagedRuntime | None, served: str) -> HybridRun | None:
    """The hybrid the checked vLLM serves: the managed one's model and command, else the served
    name when it is a local model dir (on this machine's platform)."""
    state = managed_vllm_record(data_dir) if runtime is not None else None
    if state is not None:
        config = local_model_config(state.model)
        return hybrid_run(config, state.process.command, state.platform.kind)
    config = local_model_config(served)
    return None if config is None else hybrid_run(config, (), detect_platform().kind)


async def lmcache_facts(http_url: str, data_dir: Path) -> LmcacheFacts:
    async with LmcacheHttp(http_url) as lmcache:
        status = await lmcache.status()
        if isinstance(status, Unavailable):
            facts = LmcacheFacts(target=lmcache.http_url, reachable=False, reason=status.reason)
        else:
            facts = await _answered(lmcache, status, data_dir)
    leaked = await anyio.to_thread.run_sync(leaked_lmcache_segments)
    return facts.model_copy(update={"leaked_segments": leaked})


async def _answered(lmcache: LmcacheHttp, status: LmcacheHealth, data_dir: Path) -> LmcacheFacts:
    """The facts of a server that answered: its API's, and how it runs (`_lmcache_runtime`)."""
    counters = await lmcache.counters()
    runtime = await _lmcache_runtime(lmcache, data_dir)
    return LmcacheFacts(
        target=lmcache.http_url,
        reachable=True,
        version=status.version,
        unhealthy_l2=status.unhealthy_l2,
        hash_seed=runtime.hash_seed,
        chunk_size=status.report.chunk_size,
        l2_adapters=len(status.report.l2_adapters) if status.report.healthy is not None else None,
        transfer_mode=runtime.transfer_mode,
        rpc_port=runtime.rpc_port,
        registration_hang=runtime.registration_hang,
        resp_peer_gone=runtime.resp_peer_gone,
        lookup_tokens=None if isinstance(counters, Unavailable) else counters.lookup_tokens,
        found_tokens=None if isinstance(counters, Unavailable) else counters.hit_tokens,
        not_readable=runtime.not_readable,
    )


async def _lmcache_runtime(lmcache: LmcacheHttp, data_dir: Path) -> LmcacheRuntime:
    """How the server at `lmcache` runs: the managed one's recorded wiring, environment and log;
    for any other, what its /config reports, and what is not readable here."""
    url = lmcache.http_url
    managed = await anyio.to_thread.run_sync(managed_lmcache_runtime, data_dir, url)
    if managed is not None:
        return managed
    reported = await lmcache.reported_wiring()
    hidden = facts_not_readable_here(Configured("lmcache server", url), LMCACHE_HIDDEN)
    if isinstance(reported, Unavailable):
        return LmcacheRuntime(not_readable=hidden)
    return LmcacheRuntime(
        transfer_mode=reported.transfer_mode, rpc_port=reported.rpc_port, not_readable=hidden
    )
