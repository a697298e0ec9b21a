"""`vllm_start` / `vllm start`: vLLM, and for an MP LMCache connector the whole stack under it.

1. The engine for L2: the configured one (`EPISTEMIC_GRAPH_KVCACHE_URL`), else the managed one,
   held as the `Lifetime` says (the session's KV access, or running until `engine stop`).
2. The managed `lmcache server`, planned by the config generator from the vLLM launch (CPU
   transfer mode and shared memory, a chunk size that is a whole number of vLLM blocks, loopback,
   the same hash seed), started or reused under the same lifetime (a lease, or until stop).
3. vLLM with LMCache's MP connector pointed at that server.

A piece that already runs is reused when it matches; otherwise the start stops with an error that
names the difference, before anything new is started. A start that fails stops what it started
itself: the lmcache server (its /dev/shm pool goes with it) and, running until stop, the engine;
a session's engine serves its KV tools too and ends with the session. What it reused runs on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import (
    KvTarget,
    engine_environment,
    resolve_kv_target,
)
from graph_kvcache_mcp.connectors.files.hf_config import local_model_config, read_hf_config
from graph_kvcache_mcp.connectors.lmcache.process import DEFAULT_READY_TIMEOUT_S
from graph_kvcache_mcp.connectors.stack.resp import prepare_resp_launch
from graph_kvcache_mcp.connectors.stack.reuse import (
    check_lmcache_reusable,
    check_vllm_reusable,
)
from graph_kvcache_mcp.connectors.vllm.platform import detect_platform
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.process import WaitProgress as WaitProgress  # for adapters
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts, facts_from_hf_config
from graph_kvcache_mcp.domain.lmcache.stack import (
    MP_CONNECTORS,
    StackOptions,
    generic_facts,
    plan_stack_server,
)
from graph_kvcache_mcp.domain.vllm.hybrid.launch import refuse_unservable
from graph_kvcache_mcp.domain.vllm.launch import Platform, VllmLaunch
from graph_kvcache_mcp.errors import ConfigError, FileRefused
from graph_kvcache_mcp.services.lmcache.plan import server_environment
from graph_kvcache_mcp.services.stack.lifetime import Lifetime, ServerLaunch
from graph_kvcache_mcp.services.stack.stack import Stack, Undo
from graph_kvcache_mcp.services.stack.views import VllmStatusOut

log = logging.getLogger(__name__)


async def start_vllm(
    settings: Settings,
    launch: VllmLaunch,
    lifetime: Lifetime,
    *,
    ready_timeout_s: float,
    calls_base_url: str,
    options: StackOptions | None = None,
    progress: WaitProgress | None = None,
    managed: ManagedVllm | None = None,
    env: Mapping[str, str] | None = None,
    platform: Platform | None = None,
) -> VllmStatusOut:
    """Start (or reuse) vLLM as `launch` asks; with an MP connector, the stack under it first.

    `calls_base_url`: where calls went before (the result's `tools_base_url` when vLLM gives
    none). `managed`: the session's handle on the managed vLLM, else one for the data dir.
    `env` is added to vLLM's environment; `platform` skips detecting it (tests).

    Raises:
        ConfigError: the launch and the server cannot agree (ports, chunk size).
        EngineProcessError: the managed engine could not start.
        LmcacheProcessError: the server is missing, runs with other settings, or did not start.
        VllmProcessError: vLLM runs with another tier, or did not start.
    """
    stack = Stack.of(settings, vllm=managed)
    coordinator = options.coordinator if options is not None else None
    if coordinator is not None and launch.kv_connector not in MP_CONNECTORS:
        raise ConfigError(
            f"a coordinator joins the lmcache server of an MP stack, and kv_connector "
            f"{launch.kv_connector} starts none: use kv_connector mp_native"
        )
    if launch.kv_connector in MP_CONNECTORS:
        return await _start_mp_stack(
            stack,
            launch,
            lifetime,
            options=options,
            ready_timeout_s=ready_timeout_s,
            progress=progress,
            env=env,
            platform=platform,
        )
    if launch.needs_engine_environment:
        engine = await anyio.to_thread.run_sync(resolve_kv_target, settings)  # once per start
        env = {**engine_environment(engine, settings), **(env or {})}
    start = partial(stack.vllm.start, launch, env=env, ready_timeout_s=ready_timeout_s)
    status = await anyio.to_thread.run_sync(partial(start, progress=progress))
    return VllmStatusOut.of(status, status.base_url or calls_base_url)


async def _start_mp_stack(
    stack: Stack,
    launch: VllmLaunch,
    lifetime: Lifetime,
    *,
    options: StackOptions | None,
    ready_timeout_s: float,
    progress: WaitProgress | None,
    env: Mapping[str, str] | None,
    platform: Platform | None,
) -> VllmStatusOut:
    """Engine, then `lmcache server`, then vLLM; returns vLLM's status with the server's."""
    say = _announcer(progress)
    where = platform if platform is not None else await anyio.to_thread.run_sync(_detect)
    # A hybrid LMCache cannot serve here is refused before the engine or server starts.
    refuse_unservable(await _model_config(launch.model), where.kind, lmcache_mp=True)
    settings = stack.settings
    started = Undo(stack, lifetime)
    try:
        resp = launch.l2_over_resp
        started.engine = await lifetime.ensure_engine(stack, resp=resp, progress=None)
        # Once per start, after the engine is up: the plan, the server's token and its proof
        # all come from this one resolution.
        target = await anyio.to_thread.run_sync(resolve_kv_target, settings)
        await say(f"L2: the {target.source} engine at {target.base_url}")
        server = await _planned_server(launch, stack, where, target, options, say)
        coordinator = options.coordinator if options else None
        advertise_ip = options.coordinator_advertise_ip if options else None
        join = partial(stack.join_coordinator, server.spec, coordinator, advertise_ip=advertise_ip)
        joined, started.coordinator = await anyio.to_thread.run_sync(join)
        server = replace(server, spec=joined)
        await anyio.to_thread.run_sync(check_vllm_reusable, stack.vllm, launch)
        await anyio.to_thread.run_sync(check_lmcache_reusable, stack.lmcache, server.spec)
        await say(f"starting (or reusing) the lmcache server on port {launch.lmcache_port}")
        ready_s = DEFAULT_READY_TIMEOUT_S
        server_status = await lifetime.start_server(stack, server, ready_timeout_s=ready_s)
        started.lmcache = not server_status.reused
        status = await anyio.to_thread.run_sync(
            partial(
                stack.vllm.start,
                launch,
                env=env,
                ready_timeout_s=ready_timeout_s,
                progress=progress,
                platform=where,
            )
        )
    except BaseException:
        with anyio.CancelScope(shield=True):
            await started.run()
        raise
    out = VllmStatusOut.of(status, status.base_url or settings.vllm_base_url)
    return out.model_copy(
        update={
            "lmcache": server_status,
            "l2_engine_url": target.base_url,
            "stack_notes": server.notes,
        }
    )


Say = Callable[[str], Awaitable[None]]


def _announcer(progress: WaitProgress | None) -> Say:
    """A progress line sender (reporters expect a worker thread, so it is called from one)."""
    note = progress or (lambda _elapsed, _total, _message: None)

    async def say(message: str) -> None:
        await anyio.to_thread.run_sync(note, 0.0, 0.0, message)

    return say


async def _planned_server(
    launch: VllmLaunch,
    stack: Stack,
    where: Platform,
    engine: KvTarget,
    options: StackOptions | None,
    say: Say,
) -> ServerLaunch:
    """The server the config generator plans for `launch`, its `${NAME}`s filled in, moved
    onto the engine's RESP wire when the launch asks for it."""
    facts = await anyio.to_thread.run_sync(_facts_of, launch.model)
    plan = plan_stack_server(
        launch,
        facts,
        where,
        engine_url=engine.base_url,
        options=options or StackOptions(),
        insecure_hosts=stack.settings.insecure_http_hosts,
    )
    server = plan.lmcache_server
    assert server is not None  # an MP plan always has one (plan_stack_server checked the mode)
    server_env = server_environment(
        server.env, engine, insecure_hosts=stack.settings.insecure_http_hosts
    )
    if not launch.l2_over_resp:
        return ServerLaunch(server, server_env, None, list(plan.notes))
    resp = await anyio.to_thread.run_sync(prepare_resp_launch, stack.engine, server, server_env)
    await say(f"L2: LMCache's resp adapter on the engine's RESP wire {resp.peer.address}")
    return ServerLaunch(resp.server, resp.env, resp.peer, list(plan.notes))


async def _model_config(model: str) -> dict[str, Any] | None:
    return await anyio.to_thread.run_sync(local_model_config, model)


def _detect() -> Platform:
    return detect_platform()


def _facts_of(model: str) -> ModelFacts:
    """The model's facts from its local config.json; stand-ins for a hub id."""
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        return generic_facts(model)
    try:
        return facts_from_hf_config(read_hf_config(path), name=model)
    except (ConfigError, FileRefused, OSError):
        return generic_facts(model)
