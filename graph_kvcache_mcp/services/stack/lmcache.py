"""The managed `lmcache server` behind the stack service: started for one `Lifetime` (on the
engine's RESP wire when planned so, joined to a coordinator when asked), its status, its restart,
and its stop in the order that never hangs vLLM: the managed vLLM that uses it first (only when
forced), then the server, then the managed coordinator it joined. A coordinator named by URL is
used, never stopped; a failed start stops the coordinator it started itself.

The CLI's verbs run until stop and block (`*_until_stop`); a session's go through its lease.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.lmcache.access import lmcache_python
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import (
    LmcacheState,
    LmcacheStatus,
    LmcacheStopResult,
)
from graph_kvcache_mcp.connectors.stack.dependency import dependency_reason, stop_dependent_vllm
from graph_kvcache_mcp.connectors.stack.resp import (
    prepare_resp_launch,
    restart_resp_lmcache,
    start_resp_lmcache,
)
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec
from graph_kvcache_mcp.services.lmcache.coordinator import MANAGED, joined_server
from graph_kvcache_mcp.services.lmcache.plan import server_environment
from graph_kvcache_mcp.services.stack.lifetime import Lifetime, RunsUntilStop

Note = Callable[[str], None]


async def start_server(
    settings: Settings,
    server: ProcessSpec,
    lifetime: Lifetime,
    *,
    ready_timeout_s: float,
    resp: bool = False,
    coordinator: str | None = None,
) -> LmcacheStatus:
    """Start the planned `server` (or reuse the one that runs) for `lifetime`. `resp`: its L2 is
    the managed engine's RESP wire, started and proven to answer first. `coordinator`: join
    'managed' (started or reused in the data dir) or the one at a URL.

    Raises:
        ConfigError: a coordinator URL the policy refuses.
        EngineProcessError: the engine's RESP wire could not be started.
        LmcacheProcessError: the server (or the managed coordinator) did not start.
    """
    if isinstance(lifetime, RunsUntilStop):
        until_stop = partial(
            start_server_until_stop,
            settings,
            server,
            ready_timeout_s=ready_timeout_s,
            resp=resp,
            coordinator=coordinator,
        )
        return await anyio.to_thread.run_sync(until_stop)
    env = server_environment(server.env, settings)
    join = partial(join_coordinator, settings, server, coordinator)
    server, coordinator_started = await anyio.to_thread.run_sync(join)
    try:
        peer = None
        if resp:
            if settings.kv_url is None:
                await lifetime.kv.start_engine(resp=True)
            aim = partial(prepare_resp_launch, lifetime.kv.engine, server, env)
            launch = await anyio.to_thread.run_sync(aim)
            server, env, peer = launch.server, launch.env, launch.peer
        return await lifetime.lmcache.start(
            server, env=env, ready_timeout_s=ready_timeout_s, resp_peer=peer
        )
    except BaseException:
        if coordinator_started:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(ManagedCoordinator(settings.data_dir).stop)
        raise


def start_server_until_stop(
    settings: Settings,
    server: ProcessSpec,
    *,
    ready_timeout_s: float,
    resp: bool = False,
    coordinator: str | None = None,
    python: Path | None = None,
    progress: Note | None = None,
) -> LmcacheStatus:
    """`start_server` for the CLI: the server (and a managed coordinator it starts) runs until
    `lmcache stop`; blocks until healthy. Raises as `start_server`."""
    env = server_environment(server.env, settings)
    python = python or lmcache_python(settings)
    server, coordinator_started = join_coordinator(settings, server, coordinator, python=python)
    managed = ManagedLmcache(settings.data_dir, python=python)
    try:
        if not resp:
            return managed.start(server, env=env, ready_timeout_s=ready_timeout_s)
        engine = ManagedEngine(settings.data_dir)
        if settings.kv_url is None:  # the managed engine's RESP wire, proven to answer first
            engine.start(resp=True, progress=progress)
        return start_resp_lmcache(engine, managed, server, env=env, ready_timeout_s=ready_timeout_s)
    except BaseException:
        if coordinator_started:
            ManagedCoordinator(settings.data_dir).stop()
        raise


def join_coordinator(
    settings: Settings,
    server: ProcessSpec,
    coordinator: str | None,
    *,
    python: Path | None = None,
) -> tuple[ProcessSpec, bool]:
    """`server` joined to `coordinator` (unchanged when None), and whether this call started the
    managed coordinator (then a failed start stops it again). Blocks while it starts; the
    managed one runs on `python` (default: the lmcache server's interpreter).

    Raises:
        ConfigError: a URL the policy refuses, or a server already joined elsewhere.
        LmcacheProcessError: the managed coordinator hashes otherwise, or did not start.
    """
    was_running = ManagedCoordinator(settings.data_dir).running_state(tidy=False)
    python = python or lmcache_python(settings)
    joined = joined_server(server, coordinator, data_dir=settings.data_dir, python=python)
    return joined, coordinator == MANAGED and was_running is None


def stop_blocker(settings: Settings) -> str | None:
    """Why the managed server must not be stopped now (the managed vLLM uses it), else None."""
    server = ManagedLmcache(settings.data_dir).running_state(tidy=False)
    return None if server is None else dependency_reason(settings.data_dir, server)


async def stop_server(
    settings: Settings, lifetime: Lifetime, *, force: bool = False, wait_s: float
) -> LmcacheStopResult:
    """Stop the managed server: the managed vLLM that uses it first, then the server (for a
    session: unless others rely on it and not `force`), then the managed coordinator it joined.

    Raises:
        LmcacheProcessError: a session's stop that others rely on, without `force`.
    """
    if isinstance(lifetime, RunsUntilStop):
        return await anyio.to_thread.run_sync(
            partial(stop_server_until_stop, settings, wait_s=wait_s)
        )
    server, also = await anyio.to_thread.run_sync(partial(_stop_vllm_first, settings, wait_s))
    result = await lifetime.lmcache.stop(force=force, term_wait_s=wait_s)
    return await anyio.to_thread.run_sync(_with_coordinator, settings, server, result, also)


def stop_server_until_stop(settings: Settings, *, wait_s: float) -> LmcacheStopResult:
    """`stop_server` for the CLI: stops the server even while sessions use it."""
    server, also = _stop_vllm_first(settings, wait_s)
    result = ManagedLmcache(settings.data_dir).stop(term_wait_s=wait_s)
    return _with_coordinator(settings, server, result, also)


def _stop_vllm_first(settings: Settings, wait_s: float) -> tuple[LmcacheState | None, list[str]]:
    server = ManagedLmcache(settings.data_dir).running_state(tidy=False)
    also = stop_dependent_vllm(
        settings.data_dir, server, vllm_python=settings.vllm_python, term_wait_s=wait_s
    )
    return server, also


def _with_coordinator(
    settings: Settings,
    server: LmcacheState | None,
    result: LmcacheStopResult,
    also: list[str],
) -> LmcacheStopResult:
    """`result`, after stopping the managed coordinator the stopped server had joined."""
    if result.stopped and server is not None:
        pid = ManagedCoordinator(settings.data_dir).stop_if_joined(server.wiring.coordinator_url)
        if pid is not None:
            also = [*also, f"the managed lmcache coordinator pid {pid} after it"]
    return result.model_copy(update={"also_stopped": also}) if also else result


def server_status(settings: Settings) -> LmcacheStatus:
    """The data dir's managed server: health, /status, leases, the coordinator it joined."""
    return ManagedLmcache(settings.data_dir).status()


def restart_server(settings: Settings) -> LmcacheStatus:
    """Restart the managed server with the same command (its L1 starts empty; L2 keeps what was
    stored); one whose L2 is the engine's RESP wire reconnects to the engine that runs now.

    Raises:
        LmcacheProcessError: no server of ours runs, the wire does not answer, or the new
            server is not healthy in time.
    """
    lmcache = ManagedLmcache(settings.data_dir)
    state = lmcache.running_state()
    env = server_environment(state.plan_env if state is not None else {}, settings)
    if state is not None and state.resp_peer is not None:  # the adapter needs the engine's wire
        return restart_resp_lmcache(ManagedEngine(settings.data_dir), lmcache, env=env)
    return lmcache.restart(env=env)
