"""The managed vLLM server: ensure one runs (reuse a healthy one), report it, stop what we started.

Layout under `<data_dir>/vllm/` (0700; files 0600): `state.json` (what we started: pid, kernel
start time, command, port, model, flags; written atomically), `vllm.log` (its stdout and stderr)
and `lifecycle.lock`, which serializes start and stop across processes, so two concurrent starts
give one server: the second waits and reuses the first. vLLM runs as a process group (API
server, `VLLM::EngineCore`, `VLLM::Worker`, a multiprocessing resource tracker) in its own session;
stopping sends SIGTERM to that group, waits, then SIGKILL — and only when the recorded pid is
still the very process we started. A port held by anything else is reported, never signalled.

Readiness is `GET /health` = 200 on a port our process group holds (`readiness`); until then the
log is where vLLM says why it is not ready. Platform, interpreter and environment checks live in
`platform`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from graph_kvcache_mcp.connectors.files.hf_config import local_model_config
from graph_kvcache_mcp.connectors.files.private import (
    exclusive,
    narrow_tree,
    private_dir,
)
from graph_kvcache_mcp.connectors.files.secret_env import filed_secrets, remove_filed_secrets
from graph_kvcache_mcp.connectors.processes.control import (
    reap_group,
    spawn_logged,
    stop_process,
    tail,
)
from graph_kvcache_mcp.connectors.processes.identity import (
    environment_value,
)
from graph_kvcache_mcp.connectors.processes.ports import port_in_use
from graph_kvcache_mcp.connectors.processes.shared_memory import group_segments
from graph_kvcache_mcp.connectors.processes.state_file import StateFile
from graph_kvcache_mcp.connectors.vllm.health import probe_server as probe_server
from graph_kvcache_mcp.connectors.vllm.health import rendezvous_files, vllm_reason
from graph_kvcache_mcp.connectors.vllm.metrics import record_final_counters
from graph_kvcache_mcp.connectors.vllm.platform import (
    CONNECTOR_HINT,
    LMCACHE_MP_HINT,
    RESERVED_CPUS_ENV,
    VLLM_HOST,
    check_vllm_importable,
    child_environment,
    detect_platform,
)
from graph_kvcache_mcp.connectors.vllm.private_files import (
    remove_identity_file,
    remove_leftovers,
    with_private_files,
)
from graph_kvcache_mcp.connectors.vllm.readiness import (
    note_or_abandon,
    reuse_foreign,
    status_of,
    unmanaged_status,
    wait_healthy,
)
from graph_kvcache_mcp.connectors.vllm.state import (
    VllmLogs,
    VllmState,
    VllmStatus,
    VllmStopResult,
)
from graph_kvcache_mcp.domain.targets import Target
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint
from graph_kvcache_mcp.domain.vllm.entry import ENTRY_MODULE as ENTRY_MODULE
from graph_kvcache_mcp.domain.vllm.launch import (
    LaunchPlan,
    Platform,
    VllmLaunch,
    check_extra_args,
    plan_launch,
)
from graph_kvcache_mcp.domain.vllm.wiring import wiring_of
from graph_kvcache_mcp.errors import VllmProcessError

DEFAULT_READY_TIMEOUT_S = 600.0
# progress(elapsed_s, deadline_s, message)
WaitProgress = Callable[[float, float, str], None]


class ManagedVllm:
    """Start, find, check and stop the vLLM server that belongs to one data dir."""

    def __init__(
        self, data_dir: Path, *, python: Path | str | None = None, tidy: bool = True
    ) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self.tidy = tidy
        """Remove a stale state record when one is found (a read-only server leaves it)."""
        self.home = self.data_dir / "vllm"
        self.state_path = self.home / "state.json"
        self.state_file = StateFile(self.state_path, VllmState)
        self.log_path = self.home / "vllm.log"
        self.python = str(python) if python else sys.executable

    def __repr__(self) -> str:
        return f"ManagedVllm({str(self.data_dir)!r})"

    # --- state -------------------------------------------------------------------------------

    def state(self) -> VllmState | None:
        return self.state_file.read()

    def running_state(self) -> VllmState | None:
        """The recorded server when it is still the process we started; clears a stale record
        unless this manager was made not to tidy (read-only)."""
        return self.state_file.read_live(tidy=self.tidy)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(
        self,
        launch: VllmLaunch,
        *,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        progress: WaitProgress | None = None,
        platform: Platform | None = None,
    ) -> VllmStatus:
        """Ensure vLLM serves `launch.model` on `launch.port`; start nothing if one already does.

        Two starts at once (two sessions, a session and the CLI) are serialized on the lifecycle
        lock: the second waits for the first and reuses its server.

        Raises:
            VllmProcessError: vLLM missing, the port held by something else, the model serving
                elsewhere, or the server exiting or not healthy in time (with vLLM's own reason).
            ConfigError: flags that cannot work on this platform, or a secret in extra_args.
        """
        check_extra_args(launch.extra_args)
        with self._exclusive():
            return self._start(launch, env, ready_timeout_s, progress, platform)

    def _start(
        self,
        launch: VllmLaunch,
        env: Mapping[str, str] | None,
        ready_timeout_s: float,
        progress: WaitProgress | None,
        platform: Platform | None,
    ) -> VllmStatus:
        note = progress or (lambda _elapsed, _total, _message: None)
        wanted = launch.served_model_name or launch.model
        if (state := self.running_state()) is not None:
            return self._reuse_ours(state, launch, wanted, ready_timeout_s, note)
        if port_in_use(VLLM_HOST, launch.port):
            return reuse_foreign(launch, wanted, self.data_dir)
        check_vllm_importable(self.python)
        launch = with_private_files(launch, self.data_dir, self.home)
        plan = plan_launch(
            launch,
            platform or detect_platform(),
            host=VLLM_HOST,
            model_config=local_model_config(launch.model),  # what a hybrid needs, or refused
        )
        if launch.kv_connector in ("mp_native", "redis_resp"):
            check_vllm_importable(self.python, module="lmcache", hint=LMCACHE_MP_HINT)
        if launch.kv_connector == "engine":
            for module in ("graph_kvcache_mcp", "crc32c"):
                check_vllm_importable(
                    self.python,
                    module=module,
                    hint=CONNECTOR_HINT,
                    env=child_environment(launch, env or {}),  # what vLLM itself will see
                )
        return self._launch(launch, plan, {**plan.env, **(env or {})}, ready_timeout_s, note)

    def stop(self, *, term_wait_s: float = 15.0) -> VllmStopResult:
        """SIGTERM our server's process group, SIGKILL after `term_wait_s`; never anything else."""
        if self.state_file.read() is None:
            return self._nothing_to_stop()  # no state, no lock file: a fresh dir stays empty
        with self._exclusive():
            return self._stop(term_wait_s)

    def _nothing_to_stop(self) -> VllmStopResult:
        return VllmStopResult(
            stopped=False,
            how="not_running",
            data_dir=str(self.data_dir),
            reason=f"no vLLM started from {self.data_dir} is running; nothing was signalled",
        )

    def _stop(self, term_wait_s: float) -> VllmStopResult:
        state = self.running_state()
        if state is None:
            return self._nothing_to_stop()
        record_final_counters(self.home, state.port)  # a window across the stop counts it all
        segments = group_segments(state.process.pid)
        how = stop_process(state.process, term_wait_s=term_wait_s)
        leftovers = reap_group(state.process.pid, wait_s=term_wait_s)
        self.state_file.clear()
        remove_filed_secrets(self.home)
        self.remove_leftovers(state, segments)
        return VllmStopResult(
            stopped=how != "not_running",
            how=how,
            pid=state.process.pid,
            leftover_pids=leftovers,
            data_dir=str(self.data_dir),
        )

    def restart(
        self,
        *,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        progress: WaitProgress | None = None,
        while_stopped: Callable[[], object] | None = None,
    ) -> VllmStatus:
        """Stop our server and start the very same command again (flags, port, data dir);
        `while_stopped` runs in between (e.g. restart the lmcache server vLLM connects to).

        Of the environment only the plan's own part is recorded (the rest may hold secrets):
        the restart gets that again, with `env` added to this process's own, as for `start`.

        Raises:
            VllmProcessError: no server of ours runs, or the new one is not healthy in time.
        """
        state = self.running_state()
        if state is None:
            raise VllmProcessError(
                f"no vLLM started from {self.data_dir} is running; start one with vllm_start"
            )
        # The core reservation the running server was given (by child_environment for a KV
        # connector, or by the user): the restart binds the same cores, so it computes alike.
        reserved = environment_value(state.process.pid, RESERVED_CPUS_ENV)
        self.stop()
        # The new connector writes its own.
        remove_identity_file(state.wiring.identity_file, self.home)
        if while_stopped is not None:
            while_stopped()
        launch = VllmLaunch(
            model=state.model,
            port=state.port,
            served_model_name=state.served_model_name,
            dev_mode=state.dev_mode,
            prompt_tokens_details=state.prompt_tokens_details,
            # the same command binds the same event sockets: the record keeps naming them
            kv_events=state.kv_events is not None,
            kv_events_endpoint=state.kv_events,
            kv_events_replay_endpoint=state.kv_events_replay,
        )
        plan = LaunchPlan(
            args=state.process.command[3:],  # after `python -m <entry module>`
            platform=state.platform,
            notes=state.notes,
            env=state.plan_env,
        )
        note = progress or (lambda _elapsed, _total, _message: None)
        kept = {RESERVED_CPUS_ENV: reserved} if reserved is not None else {}
        return self._launch(
            launch, plan, {**plan.env, **kept, **(env or {})}, ready_timeout_s, note
        )

    def status(self, *, target: Target | None = None) -> VllmStatus:
        """Our server's state; without one, whatever answers where `target` points (reported,
        never owned)."""
        recorded = self.state_file.read()
        state = self.running_state()
        if state is not None:
            healthy, served, reason = probe_server(state.base_url)
            return status_of(state, self.data_dir, reachable=healthy, served=served, reason=reason)
        if recorded is not None:  # we started it, nobody stopped it, and it is gone
            if self.tidy:
                self.remove_leftovers(recorded)
            return VllmStatus(
                running=False,
                data_dir=str(self.data_dir),
                port=recorded.port,
                reason=f"the managed vLLM (pid {recorded.process.pid}, port {recorded.port}) "
                f"crashed: it exited without being stopped. Its log says: "
                f"{vllm_reason(self.log_path)} (log: {self.log_path}); start it again with "
                "vllm_start",
            )
        return unmanaged_status(target, self.data_dir)

    def logs(self, lines: int = 50) -> VllmLogs:
        exists = self.log_path.exists()
        text = tail(self.log_path, lines, max_bytes=256 * 1024) if exists else ""
        return VllmLogs(
            log_path=str(self.log_path),
            exists=exists,
            lines=len(text.splitlines()),
            text=text,
        )

    # --- internals ---------------------------------------------------------------------------

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        private_dir(self.data_dir)
        private_dir(self.home)
        narrow_tree(self.home)  # a log an older version left 0644
        with exclusive(self.home / "lifecycle.lock"):
            yield

    def _reuse_ours(
        self,
        state: VllmState,
        launch: VllmLaunch,
        wanted: str,
        ready_timeout_s: float,
        note: WaitProgress,
    ) -> VllmStatus:
        if launch.kv_events and not state.kv_events:
            raise VllmProcessError(
                f"the vLLM started from {self.data_dir} (pid {state.process.pid}) publishes no KV "
                "events; stop it first with vllm_stop, then start it with kv_events"
            )
        if launch.port != state.port or wanted != state.served_model_name:
            raise VllmProcessError(
                f"a vLLM started from {self.data_dir} already runs (pid {state.process.pid}, "
                f"port {state.port}, model {state.served_model_name}); stop it first with "
                "vllm_stop (CLI: graph-kvcache-mcp vllm stop) to serve something else"
            )
        healthy, served, reason = probe_server(state.base_url)
        if not healthy:
            # Ours, alive, not answering yet: an earlier start still loading. Wait for it.
            note(0.0, ready_timeout_s, f"vLLM pid {state.process.pid} is still starting; waiting")
            wait_healthy(self, None, state, ready_timeout_s, note, time.monotonic())
            healthy, served, reason = probe_server(state.base_url)
        note(0.0, 0.0, f"vLLM already running (pid {state.process.pid}, port {state.port})")
        status = status_of(state, self.data_dir, reachable=healthy, served=served, reason=reason)
        return status.model_copy(update={"reused": True})

    def _launch(
        self,
        launch: VllmLaunch,
        plan: LaunchPlan,
        extra_env: Mapping[str, str],
        ready_timeout_s: float,
        note: WaitProgress,
    ) -> VllmStatus:
        command = (self.python, "-m", ENTRY_MODULE, *plan.args)
        began = time.monotonic()
        note(
            0.0,
            ready_timeout_s,
            f"starting vLLM on {VLLM_HOST}:{launch.port} ({plan.platform.kind})",
        )
        process, record = spawn_logged(
            command,
            # The engine token as a private file: vLLM's dev-mode /server_info and the logs
            # of what it imports are no place for it.
            env=filed_secrets(child_environment(launch, extra_env), self.home),
            log_path=self.log_path,
            header=f"\n=== graph-kvcache-mcp: {' '.join(command)}\n",
        )
        state = VllmState(
            process=record,
            host=VLLM_HOST,
            port=launch.port,
            base_url=VllmEndpoint.local(VLLM_HOST, launch.port).api_base,
            model=launch.model,
            served_model_name=launch.served_model_name or launch.model,
            platform=plan.platform,
            notes=plan.notes,
            plan_env=dict(plan.env),
            dev_mode=launch.dev_mode,
            prompt_tokens_details=launch.prompt_tokens_details,
            kv_events=launch.kv_events_endpoint if launch.kv_events else None,
            kv_events_replay=launch.kv_events_replay_endpoint if launch.kv_events else None,
            kv_wiring=wiring_of(command),
        )
        self.state_file.write(state)
        segments = wait_healthy(self, process, state, ready_timeout_s, note, began)
        found = [str(path) for path in rendezvous_files(self.log_path)]
        state = state.model_copy(update={"rendezvous": found, "shared_memory": sorted(segments)})
        self.state_file.write(state)
        startup = time.monotonic() - began
        ready = f"vLLM ready at {state.base_url} after {startup:.1f} s"
        note_or_abandon(self, state, segments, note, startup, ready_timeout_s, ready)
        healthy, served, reason = probe_server(state.base_url)
        status = status_of(state, self.data_dir, reachable=healthy, served=served, reason=reason)
        return status.model_copy(update={"startup_s": round(startup, 3)})

    def abandon(self, state: VllmState, segments: Iterable[str] = ()) -> None:
        """Stop a start that failed: the process, what it spawned, its record and what it
        left (`segments`: the shared memory it was seen to map)."""
        seen = {*segments, *group_segments(state.process.pid)}
        stop_process(state.process, term_wait_s=10.0)
        reap_group(state.process.pid, wait_s=5.0)
        self.state_file.clear()
        self.remove_leftovers(state, seen)

    def remove_leftovers(self, state: VllmState, segments: Iterable[str] = ()) -> None:
        """What our stopped or exited vLLM leaves behind (`private_files.remove_leftovers`)."""
        remove_leftovers(self.home, self.log_path, state, segments)
