"""`vllm_start kv_connector=mp_native`: the whole stack in one call, in order.

1. The engine for L2: the configured one (`EPISTEMIC_GRAPH_KVCACHE_URL`), else the managed one
   (the caller's `ensure_engine` starts or reuses it, holding its lease as usual).
2. The managed `lmcache server`, planned by the config generator from the vLLM launch (CPU
   transfer mode and shared memory, a chunk size that is a whole number of vLLM blocks, loopback,
   the same hash seed), started or reused by the caller's `start_lmcache` (its lease).
3. vLLM with LMCache's MP connector pointed at that server.

A piece that already runs is reused when it matches; otherwise the start stops with an error that
names the difference, before anything new is started.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.files.hf_config import read_hf_config
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus, RespPeer
from graph_kvcache_mcp.connectors.stack.mp_stack import (
    check_lmcache_reusable,
    check_vllm_reusable,
)
from graph_kvcache_mcp.connectors.stack.resp import prepare_resp_launch
from graph_kvcache_mcp.connectors.vllm.host import detect_platform
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm, WaitProgress
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts, facts_from_hf_config
from graph_kvcache_mcp.domain.lmcache.stack import StackOptions, generic_facts, plan_stack_server
from graph_kvcache_mcp.domain.vllm.launch import Platform, VllmLaunch
from graph_kvcache_mcp.errors import ConfigError, FileRefused
from graph_kvcache_mcp.services.lmcache.plan import server_environment
from graph_kvcache_mcp.services.vllm.views import VllmStatusOut

StartLmcache = Callable[[ProcessSpec, Mapping[str, str], RespPeer | None], Awaitable[LmcacheStatus]]
"""Starts (or reuses) the planned server with its environment; the peer for a resp adapter."""


async def start_mp_stack(
    managed: ManagedVllm,
    launch: VllmLaunch,
    settings: Settings,
    *,
    ensure_engine: Callable[[], Awaitable[None]],
    start_lmcache: StartLmcache,
    options: StackOptions | None = None,
    ready_timeout_s: float,
    progress: WaitProgress | None = None,
    env: Mapping[str, str] | None = None,
    platform: Platform | None = None,
) -> VllmStatusOut:
    """Engine, then `lmcache server`, then vLLM; returns vLLM's status with the server's.

    Raises:
        ConfigError: the launch and the server cannot agree (ports, chunk size).
        EngineProcessError: the managed engine could not start (from `ensure_engine`).
        LmcacheProcessError: the server is missing, runs with other settings, or did not start.
        VllmProcessError: vLLM runs with another tier, or did not start.
    """
    say = _announcer(progress)
    where = platform if platform is not None else await anyio.to_thread.run_sync(_detect)
    await ensure_engine()
    target = resolve_kv_target(settings)
    await say(f"L2: the {target.source} engine at {target.base_url}")
    server = await _planned_server(launch, settings, where, target.base_url, options, say)
    lmcache = ManagedLmcache(settings.data_dir)
    await anyio.to_thread.run_sync(check_vllm_reusable, managed, launch)
    await anyio.to_thread.run_sync(check_lmcache_reusable, lmcache, server.spec)
    await say(f"starting (or reusing) the lmcache server on port {launch.lmcache_port}")
    server_status = await start_lmcache(server.spec, server.env, server.peer)
    status = await anyio.to_thread.run_sync(
        partial(
            managed.start,
            launch,
            env=env,
            ready_timeout_s=ready_timeout_s,
            progress=progress,
            platform=where,
        )
    )
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


@dataclass(frozen=True)
class _ServerLaunch:
    """The lmcache server to start: its spec and environment, the RESP peer when its L2 goes
    over the engine's RESP wire, and the plan's notes."""

    spec: ProcessSpec
    env: dict[str, str] = field(repr=False)  # holds the engine token or the RESP password
    peer: RespPeer | None = None
    notes: list[str] = field(default_factory=list)


async def _planned_server(
    launch: VllmLaunch,
    settings: Settings,
    where: Platform,
    engine_url: str,
    options: StackOptions | None,
    say: Say,
) -> _ServerLaunch:
    """The server the config generator plans for `launch`, its `${NAME}`s filled in, moved
    onto the engine's RESP wire when the launch asks for it."""
    facts = await anyio.to_thread.run_sync(_facts_of, launch.model)
    plan = plan_stack_server(
        launch, facts, where, engine_url=engine_url, options=options or StackOptions()
    )
    server = plan.lmcache_server
    assert server is not None  # an MP plan always has one (plan_stack_server checked the mode)
    server_env = server_environment(server.env, settings)
    if not launch.l2_over_resp:
        return _ServerLaunch(server, server_env, None, list(plan.notes))
    engine = ManagedEngine(settings.data_dir)
    resp = await anyio.to_thread.run_sync(prepare_resp_launch, engine, server, server_env)
    await say(f"L2: LMCache's resp adapter on the engine's RESP wire {resp.peer.address}")
    return _ServerLaunch(resp.server, resp.env, resp.peer, list(plan.notes))


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
