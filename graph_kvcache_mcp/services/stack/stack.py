"""The managed stack of one data dir as one object: the handles of its processes, built once per
call, and the verbs that span them.

The lmcache server is started for one `Lifetime` (on the engine's RESP wire when planned so,
joined to a coordinator when asked), described, restarted, and stopped in the order that never
hangs vLLM: the managed vLLM that uses it first (only when forced), then the server, then the
managed coordinator it joined (`stop_server`, the one place that order is written). A
coordinator named by URL is a configured target: used, never started or stopped. A failed start
undoes what it started itself (`Undo`). The engine's and vLLM's own lifecycle verbs are here too,
so no other service reaches a process connector.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.children.dependents import dependents_refusal
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine, engine_binary
from graph_kvcache_mcp.connectors.engine.state import Backend, EngineStatus, EngineStopResult
from graph_kvcache_mcp.connectors.lmcache.access import lmcache_python
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.connectors.lmcache.process import DEFAULT_READY_TIMEOUT_S, ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import (
    LmcacheState,
    LmcacheStatus,
    LmcacheStopResult,
)
from graph_kvcache_mcp.connectors.stack.dependency import dependency_reason, stop_dependent_vllm
from graph_kvcache_mcp.connectors.stack.resp import prepare_resp_launch, restart_resp_lmcache
from graph_kvcache_mcp.connectors.vllm.platform import VLLM_HOST
from graph_kvcache_mcp.connectors.vllm.private_files import EVENT_SOCKETS
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmLogs, VllmStopResult
from graph_kvcache_mcp.domain.endpoints import approve_http_url, parse_http_url
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import flag_value, join_coordinator
from graph_kvcache_mcp.domain.targets import (
    Configured,
    ManagedHere,
    Target,
    logs_not_readable_here,
    not_managed_here,
)
from graph_kvcache_mcp.errors import EngineProcessError, VllmProcessError
from graph_kvcache_mcp.services.lmcache.plan import server_environment
from graph_kvcache_mcp.services.stack.description import StackDescription, describe_stack
from graph_kvcache_mcp.services.stack.engine_death import status_with_death
from graph_kvcache_mcp.services.stack.lifetime import Lifetime, Note, ServerLaunch
from graph_kvcache_mcp.services.stack.views import VllmStatusOut

log = logging.getLogger(__name__)

MANAGED_COORDINATOR = "managed"
"""What a caller passes to join the data dir's own coordinator (anything else is a URL)."""

CoordinatorTarget = ManagedHere | Configured


@dataclass(frozen=True)
class Stack:
    """The engine, lmcache server, coordinator and vLLM handles of `settings.data_dir`."""

    settings: Settings
    engine: ManagedEngine
    lmcache: ManagedLmcache
    coordinator: ManagedCoordinator
    vllm: ManagedVllm

    @classmethod
    def of(
        cls,
        settings: Settings,
        *,
        vllm: ManagedVllm | None = None,
        lmcache_python_override: Path | None = None,
    ) -> Stack:
        """The data dir's handles. `vllm`: a session's own handle on the managed vLLM;
        `lmcache_python_override`: the CLI's --python for the server and its coordinator."""
        data_dir = settings.data_dir
        python = lmcache_python_override or lmcache_python(settings)
        return cls(
            settings=settings,
            engine=ManagedEngine(data_dir),
            lmcache=ManagedLmcache(data_dir, python=python),
            coordinator=ManagedCoordinator(data_dir, python=python),
            vllm=vllm or ManagedVllm(data_dir, python=settings.vllm_python),
        )

    # --- the lmcache server ------------------------------------------------------------------

    async def start_server(
        self,
        server: ProcessSpec,
        lifetime: Lifetime,
        *,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        resp: bool = False,
        coordinator: str | None = None,
        progress: Note | None = None,
    ) -> LmcacheStatus:
        """Start the planned `server` (or reuse the one that runs) for `lifetime`. `resp`: its L2
        is the managed engine's RESP wire, started and proven to answer first. `coordinator`:
        join 'managed' (started or reused in the data dir) or the one at a URL.

        Raises:
            ConfigError: a coordinator URL the policy refuses.
            EngineProcessError: the engine's RESP wire could not be started.
            LmcacheProcessError: the server (or the managed coordinator) did not start.
        """
        env = server_environment(
            server.env,
            resolve_kv_target(self.settings),
            insecure_hosts=self.settings.insecure_http_hosts,
        )
        server, coordinator_started = await anyio.to_thread.run_sync(
            self.join_coordinator, server, coordinator
        )
        undo = Undo(self, lifetime, coordinator=coordinator_started)
        try:
            planned = ServerLaunch(server, env)
            if resp:
                await lifetime.ensure_engine(self, resp=True, progress=progress)
                aim = partial(prepare_resp_launch, lifetime.engine(self), server, env)
                wire = await anyio.to_thread.run_sync(aim)
                planned = ServerLaunch(wire.server, wire.env, wire.peer)
            return await lifetime.start_server(self, planned, ready_timeout_s=ready_timeout_s)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await undo.run()
            raise

    def coordinator_target(self, coordinator: str) -> CoordinatorTarget:
        """'managed': the data dir's own coordinator; anything else a URL we only use.

        Raises:
            ConfigError: a URL the policy refuses.
        """
        if coordinator == MANAGED_COORDINATOR:
            return ManagedHere("lmcache coordinator", self.settings.data_dir)
        endpoint = approve_http_url(
            coordinator,
            what="LMCache coordinator URL",
            insecure_hosts=self.settings.insecure_http_hosts,
        )
        return Configured("lmcache coordinator", endpoint.url.rstrip("/"))

    def join_coordinator(
        self, server: ProcessSpec, coordinator: str | None, *, advertise_ip: str | None = None
    ) -> tuple[ProcessSpec, bool]:
        """`server` joined to `coordinator` (unchanged when None), and whether this call started
        the managed coordinator (then a failed start stops it again). Blocks while it starts.
        `advertise_ip`: where a coordinator on another host calls the server back (a node's
        127.X.Y.Z); loopback by default.

        Raises:
            ConfigError: a URL the policy refuses, or a server already joined elsewhere.
            LmcacheProcessError: the managed coordinator hashes otherwise, or did not start.
        """
        if coordinator is None:
            return server, False
        target = self.coordinator_target(coordinator)
        if isinstance(target, Configured):
            where = {"advertise_ip": advertise_ip} if advertise_ip else {}
            return join_coordinator(server, target.url, **where), False
        was_running = self.coordinator.running_state(tidy=False)
        chunk = int(flag_value(server, "--chunk-size", "256"))
        algorithm = flag_value(server, "--hash-algorithm", "blake3")
        state = self.coordinator.ensure(chunk_size=chunk, hash_algorithm=algorithm)
        return join_coordinator(server, state.url), was_running is None

    def stop_blocker(self) -> str | None:
        """Why the managed server must not be stopped now (the managed vLLM uses it), else None."""
        server = self.lmcache.running_state(tidy=False)
        return None if server is None else dependency_reason(self.settings.data_dir, server)

    async def stop_server(
        self, lifetime: Lifetime, *, force: bool = False, wait_s: float
    ) -> LmcacheStopResult:
        """Stop the managed server: the managed vLLM that uses it first, then the server (for a
        session: unless others rely on it and not `force`), then the managed coordinator it
        joined.

        Raises:
            LmcacheProcessError: a session's stop that others rely on, without `force`.
        """
        server = await anyio.to_thread.run_sync(partial(self.lmcache.running_state, tidy=False))
        also = await anyio.to_thread.run_sync(self._stop_dependent_vllm, server, wait_s)
        result = await lifetime.stop_server(self, force=force, wait_s=wait_s)
        if result.stopped and server is not None:
            joined = server.wiring.coordinator_url
            pid = await anyio.to_thread.run_sync(self.coordinator.stop_if_joined, joined)
            if pid is not None:
                also = [*also, f"the managed lmcache coordinator pid {pid} after it"]
        return result.model_copy(update={"also_stopped": also}) if also else result

    def _stop_dependent_vllm(self, server: LmcacheState | None, wait_s: float) -> list[str]:
        python = self.settings.vllm_python
        return stop_dependent_vllm(
            self.settings.data_dir, server, vllm_python=python, term_wait_s=wait_s
        )

    def server_status(self) -> LmcacheStatus:
        """The data dir's managed server: health, /status, leases, the coordinator it joined."""
        return self.lmcache.status()

    def restart_server(self) -> LmcacheStatus:
        """Restart the managed server with the same command (its L1 starts empty; L2 keeps what
        was stored); one whose L2 is the engine's RESP wire reconnects to the engine that runs
        now.

        Raises:
            LmcacheProcessError: no server of ours runs, the wire does not answer, or the new
                server is not healthy in time.
        """
        state = self.lmcache.running_state()
        plan_env = state.plan_env if state is not None else {}
        env = server_environment(
            plan_env,
            resolve_kv_target(self.settings),
            insecure_hosts=self.settings.insecure_http_hosts,
        )
        if state is not None and state.resp_peer is not None:  # the adapter needs the wire
            return restart_resp_lmcache(self.engine, self.lmcache, env=env)
        return self.lmcache.restart(env=env)

    # --- the engine (the CLI's; a session's goes through its KV access) ----------------------

    def start_engine(
        self,
        *,
        port: int | None,
        backend: Backend | None,
        ready_timeout_s: float,
        progress: Note | None = None,
        resp: bool = False,
    ) -> EngineStatus:
        """Start (or reuse) the data dir's engine until `engine stop`; the settings fill in what
        is not given.

        Raises:
            EngineProcessError: it could not start; the message quotes the engine's reason.
        """
        return self.engine.start(
            port=port or self.settings.engine_port,
            backend=backend or self.settings.engine_backend,
            ready_timeout_s=ready_timeout_s,
            progress=progress,
            resp=resp,
        )

    def stop_engine(self, *, wait_s: float, force: bool = False) -> EngineStopResult:
        """Stop the engine this data dir started, even while sessions use it; unless `force`,
        not while an `lmcache server` or vLLM we started uses it as its KV tier.

        Raises:
            EngineProcessError: such processes run (the message names them).
        """
        if not force and (refusal := dependents_refusal(self.settings.data_dir)) is not None:
            raise EngineProcessError(refusal)
        return self.engine.stop(term_wait_s=wait_s)

    @staticmethod
    def check_engine_installed() -> None:
        """Nothing, when the engine package and its binary are installed.

        Raises:
            EngineProcessError: they are not; the message gives the install command.
        """
        engine_binary()

    def engine_status(self) -> EngineStatus:
        """Whether the data dir's engine runs and answers, and which sessions use it."""
        return self.engine.status()

    # --- vLLM (its start, which may bring up the stack under it, is `start.start_vllm`) --------

    def vllm_event_sockets(self) -> tuple[str, str]:
        """The unix sockets the managed vLLM binds for its KV event feed and replay (in its
        private dir), for a node's edge routes that publish them."""
        feed, replay = (self.vllm.home / name for name in EVENT_SOCKETS)
        return str(feed), str(replay)

    def vllm_target(self, calls_base_url: str) -> Target:
        """The vLLM that calls go to: managed here when it is on the loopback address where
        this data dir serves vLLM, else configured (something else runs it).

        Raises:
            ConfigError: the URL is not an http(s) URL.
        """
        host = parse_http_url(calls_base_url, what="VLLM_BASE_URL").host
        if host in (VLLM_HOST, "localhost"):
            return ManagedHere("vLLM", self.settings.data_dir, calls_base_url)
        return Configured("vLLM", calls_base_url)

    def vllm_status(self, calls_base_url: str) -> VllmStatusOut:
        """The managed vLLM; without one, whatever answers where calls go (a configured vLLM at
        its own URL, never a loopback port of the same number).

        Raises:
            ConfigError: the URL is not an http(s) URL.
        """
        status = self.vllm.status(target=self.vllm_target(calls_base_url))
        return status_with_death(VllmStatusOut.of(status, calls_base_url), self.vllm)

    def stop_vllm(self, calls_base_url: str, *, wait_s: float) -> VllmStopResult:
        """Stop the vLLM this data dir started: SIGTERM to its group, SIGKILL after `wait_s`
        (its lmcache server, if any, runs on). With none, a configured vLLM is named as not
        ours to stop.

        Raises:
            ConfigError: the URL is not an http(s) URL.
        """
        target = self.vllm_target(calls_base_url)
        result = self.vllm.stop(term_wait_s=wait_s)
        if result.how == "not_running" and isinstance(target, Configured):
            return result.model_copy(update={"reason": not_managed_here(target)})
        return result

    def vllm_logs(self, calls_base_url: str, *, lines: int) -> VllmLogs:
        """The last `lines` of the managed vLLM's log. When calls go to a configured vLLM and
        none runs here, its log is not ours to read (nor is the data dir's old one about it).

        Raises:
            ConfigError: the URL is not an http(s) URL.
            VllmProcessError: calls go to a configured vLLM and this data dir runs none (the
                message says where its log is).
        """
        target = self.vllm_target(calls_base_url)
        if isinstance(target, Configured) and self.vllm.running_state() is None:
            raise VllmProcessError(logs_not_readable_here(target, self.vllm.log_path))
        return self.vllm.logs(max(1, lines))

    def describe(self) -> StackDescription:
        """What of this stack runs now, as its state files record it."""
        return describe_stack(self.settings.data_dir)


@dataclass
class Undo:
    """What a stack start has started itself so far: what a failed start stops again, the
    lmcache server first (it writes to the engine), then the coordinator it joined, then the
    engine."""

    stack: Stack
    lifetime: Lifetime
    engine: bool = False
    lmcache: bool = False
    coordinator: bool = False

    async def run(self) -> None:
        if self.lmcache:
            result = await self.lifetime.withdraw_server(self.stack)
            if result is None:
                log.warning("the stack did not start; left the lmcache server another holds")
            else:
                log.warning(
                    "the stack did not start: stopped the lmcache server it started (%s)",
                    result.how,
                )
        if self.coordinator:
            await anyio.to_thread.run_sync(self.stack.coordinator.stop)
            log.warning("the stack did not start: stopped the lmcache coordinator it started")
        if self.engine:
            stopped = await anyio.to_thread.run_sync(self.stack.engine.stop)
            log.warning("the stack did not start: stopped the engine it started (%s)", stopped.how)
