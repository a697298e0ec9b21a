"""The managed `lmcache server`: start it from a plan, report it, stop only what we started.

Layout under `<data_dir>/lmcache/`: `state.json` (pid, kernel start time, command, ports),
`lmcache.log` and `leases/` (one file per server session using the server, see
`connectors.processes.leases`). The server runs in its own session from the interpreter of
LMCache's venv (`GRAPH_KVCACHE_LMCACHE_PYTHON`, default this one) as `python -m
graph_kvcache_mcp.plugins.lmcache.server server ...` (`lmcache server` with only the read-only
admin routes and its KV RPC on a unix socket in this private dir, `rpc-<port>.sock`: see that
module); its secrets (the engine token, the RESP password) reach it as private files
(`connectors.files.secret_env`), never in its environment, which its admin API could show.
Readiness is `GET /healthcheck` answering `{"status": "healthy"}` on its HTTP port, and then both
of its ports proven held by the process we started (a neighbour who bound one first would
otherwise get vLLM's KV traffic or answer our health checks). Start, stop
and release hold `<home>/lifecycle.lock`, so two callers never interleave. A server started by a
session stops when the last session holding a lease releases it (`lease_rules`); one started by
`lmcache start` runs until `lmcache stop`.

A server whose L2 is LMCache's `resp` adapter records the process it connected to (`resp_peer`):
that adapter connects once and never reconnects, so once that process is gone (stopped, or
restarted as a new process) the status says L2 is dead until the server restarts.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import exclusive, private_dir
from graph_kvcache_mcp.connectors.files.secret_env import filed_secrets, remove_filed_secrets
from graph_kvcache_mcp.connectors.lmcache.readiness import (
    ENTRY_MODULE,
    check_importable,
    get_json,
    wait_healthy,
)
from graph_kvcache_mcp.connectors.lmcache.state import (
    LmcacheState,
    LmcacheStatus,
    LmcacheStopResult,
    RespPeer,
)
from graph_kvcache_mcp.connectors.processes.control import (
    ML_STACK_INHERITED,
    ML_STACK_INHERITED_PREFIXES,
    inherited_environment,
    spawn_logged,
    stop_process,
)
from graph_kvcache_mcp.connectors.processes.identity import (
    is_alive,
)
from graph_kvcache_mcp.connectors.processes.lease_rules import (
    LeasedLifecycle,
    keep_until_stop,
)
from graph_kvcache_mcp.connectors.processes.leases import Leases
from graph_kvcache_mcp.connectors.processes.ports import port_in_use
from graph_kvcache_mcp.connectors.processes.state_file import StateFile
from graph_kvcache_mcp.connectors.processes.status import running_fields
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec
from graph_kvcache_mcp.domain.lmcache.stack import MAX_IPC_PATH, rpc_socket_path
from graph_kvcache_mcp.domain.lmcache.status import report_from_status
from graph_kvcache_mcp.domain.vllm.wiring import lmcache_wiring_of
from graph_kvcache_mcp.errors import LmcacheProcessError

LMCACHE_HOST = "127.0.0.1"
RPC_URL_ENV = "GRAPH_KVCACHE_LMCACHE_RPC_URL"
"""Where our entry point makes the server's KV RPC listen instead of its TCP port."""
DEFAULT_READY_TIMEOUT_S = 180.0


class ManagedLmcache(LeasedLifecycle[LmcacheStopResult]):
    """Start, find, check and stop the `lmcache server` that belongs to one data dir."""

    TERM_WAIT_S = 15.0

    def __init__(self, data_dir: Path, *, python: Path | str | None = None) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self.home = self.data_dir / "lmcache"
        self.state_file = StateFile(self.home / "state.json", LmcacheState)
        self.log_path = self.home / "lmcache.log"
        self.python = str(python) if python else sys.executable
        self.leases = Leases(self.home / "leases")

    def __repr__(self) -> str:
        return f"ManagedLmcache({str(self.data_dir)!r})"

    def start(
        self,
        server: ProcessSpec,
        *,
        env: Mapping[str, str],
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        runs_until_stop: bool = True,
        resp_peer: RespPeer | None = None,
    ) -> LmcacheStatus:
        """Ensure the planned server runs; reuse ours when it already does.

        `server` is the plan's `lmcache_server` (argv from `lmcache ...`); `env` is the
        environment with real values (the plan's holds `${...}` references). A new server
        records `runs_until_stop`: server sessions pass False, so the last session to release
        it stops it (`release`); otherwise only `stop` ends it, and reusing a session's server
        with True marks it so. `resp_peer`: the process a `resp` L2 adapter will connect to; a
        running server whose peer is gone is refused (it must restart).

        Raises:
            LmcacheProcessError: LMCache missing, a port held by something else, or the server
                exiting or not healthy in time (with the log's last words).
        """
        port, http_port = _flag_int(server.argv, "--port"), _flag_int(server.argv, "--http-port")
        with self._exclusive():
            if (state := self.state_file.read_live()) is not None:
                if (state.port, state.http_port) != (port, http_port):
                    raise LmcacheProcessError(
                        f"an lmcache server started from {self.data_dir} already runs (pid "
                        f"{state.process.pid}, port {state.port}); stop it first with lmcache_stop"
                    )
                peer = state.resp_peer
                if peer is not None and not is_alive(peer.pid, peer.start_ticks):
                    raise LmcacheProcessError(
                        f"the running lmcache server (pid {state.process.pid}) is tied to an "
                        f"engine process that is gone ({_peer_gone(peer)}); stop it "
                        "with lmcache_stop and start it again"
                    )
                if runs_until_stop:
                    state = keep_until_stop(self.state_file, state)
                return self._status_of(state).model_copy(update={"reused": True})
            for taken in (port, http_port):
                if port_in_use(LMCACHE_HOST, taken):
                    raise LmcacheProcessError(
                        f"port {taken} on {LMCACHE_HOST} is held by a process this tool did not "
                        "start; it was left alone. Choose other ports"
                    )
            check_importable(self.python)
            return self._launch(
                server, env, port, http_port, ready_timeout_s, runs_until_stop, resp_peer
            )

    def restart(
        self,
        *,
        env: Mapping[str, str],
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        resp_peer: RespPeer | None = None,
    ) -> LmcacheStatus:
        """Stop our server and start the very same command again (its L1 starts empty; its L2,
        the engine, keeps what was stored). `env` fills in the recorded plan environment;
        `resp_peer` is the engine process a `resp` adapter connects to now (`stack.resp`).

        Raises:
            LmcacheProcessError: no server of ours runs, or the new one is not healthy in time.
        """
        with self._exclusive():
            state = self.running_state()
            if state is None:
                raise LmcacheProcessError(
                    f"no lmcache server started from {self.data_dir} is running; start one "
                    "with lmcache_start or vllm_start kv_connector=mp_native"
                )
            self._stop(self.TERM_WAIT_S)
            server = ProcessSpec(argv=["lmcache", *state.wiring.args], env=state.plan_env)
            return self._launch(
                server,
                env,
                state.port,
                state.http_port,
                ready_timeout_s,
                state.runs_until_stop,
                resp_peer,
                python=state.process.command[0],  # the interpreter it ran with, not ours
            )

    def running_state(self, *, tidy: bool = True) -> LmcacheState | None:
        """The recorded server when it is still the process we started; a stale record is
        cleared when `tidy` (read-only callers leave everything as it is)."""
        return self.state_file.read_live(tidy=tidy)

    def status(self, *, tidy: bool = True) -> LmcacheStatus:
        """Whether our server runs and is healthy, with /status and the live leases; stale
        records and leases are removed on the way when `tidy`."""
        state = self.running_state(tidy=tidy)
        if state is None:
            return LmcacheStatus(
                running=False,
                data_dir=str(self.data_dir),
                leases=list(self.leases.live(tidy=tidy).values()),
                reason=f"no managed lmcache server runs for {self.data_dir}; start one with "
                "lmcache_start (CLI: graph-kvcache-mcp lmcache start)",
            )
        return self._status_of(state, tidy=tidy)

    # --- internals ---------------------------------------------------------------------------

    def _stop(self, term_wait_s: float) -> LmcacheStopResult:
        state = self.running_state()
        if state is None:
            return LmcacheStopResult(
                stopped=False,
                how="not_running",
                data_dir=str(self.data_dir),
                reason=f"no lmcache server started from {self.data_dir} is running; nothing "
                "was signalled",
            )
        how = stop_process(state.process, term_wait_s=term_wait_s)
        self.state_file.clear()
        remove_filed_secrets(self.home)
        if state.rpc_url is not None:  # LMCache leaves its socket file behind
            Path(state.rpc_url.removeprefix("ipc://")).unlink(missing_ok=True)
        return LmcacheStopResult(
            stopped=how != "not_running",
            how=how,
            pid=state.process.pid,
            data_dir=str(self.data_dir),
        )

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        private_dir(self.home)
        with exclusive(self.home / "lifecycle.lock"):
            yield

    def _launch(
        self,
        server: ProcessSpec,
        env: Mapping[str, str],
        port: int,
        http_port: int,
        ready_timeout_s: float,
        runs_until_stop: bool,
        resp_peer: RespPeer | None,
        *,
        python: str | None = None,
    ) -> LmcacheStatus:
        command = (python or self.python, "-m", ENTRY_MODULE, *server.argv[1:])
        began = time.monotonic()
        socket = rpc_socket_path(self.data_dir, port)
        if socket is None:
            # LMCache would serve its KV RPC on loopback TCP, where every local user can read
            # and write L1 (and, through our adapter, the engine): refused, never a fallback.
            raise LmcacheProcessError(
                f"the data dir {self.data_dir} is too long for the lmcache server's private KV "
                f"RPC socket (over {MAX_IPC_PATH} characters with lmcache/rpc-{port}.sock): it "
                "would fall back to a TCP port every local user can reach. Choose a shorter "
                "--data-dir"
            )
        socket.unlink(missing_ok=True)  # a socket a killed server left; ours (0700 dir)
        rpc_url = f"ipc://{socket}"
        env = {**env, RPC_URL_ENV: rpc_url}
        process, record = spawn_logged(
            command,
            # Only what a Python + torch stack needs, then the plan's own (the engine's URL and
            # the token's file for the L2 adapter): none of our other secrets, and no secret
            # value at all.
            env=filed_secrets(
                {**inherited_environment(ML_STACK_INHERITED, ML_STACK_INHERITED_PREFIXES), **env},
                self.home,
            ),
            log_path=self.log_path,
            header=f"\n=== graph-kvcache-mcp: {' '.join(command)}\n",
        )
        state = LmcacheState(
            process=record,
            host=LMCACHE_HOST,
            port=port,
            http_port=http_port,
            http_url=f"http://{LMCACHE_HOST}:{http_port}",
            rpc_url=rpc_url,
            runs_until_stop=runs_until_stop,
            resp_peer=resp_peer,
            plan_env=dict(server.env),
            lmcache_wiring=lmcache_wiring_of(command[3:]),
        )
        self.state_file.write(state)
        wait_healthy(self, process, state, ready_timeout_s, began)
        status = self._status_of(state)
        return status.model_copy(update={"startup_s": round(time.monotonic() - began, 3)})

    def _status_of(self, state: LmcacheState, *, tidy: bool = True) -> LmcacheStatus:
        health = get_json(state.http_url + "/healthcheck")
        status = get_json(state.http_url + "/status")
        healthy = health.get("status") == "healthy"
        return LmcacheStatus(
            **running_fields(state.process, self.data_dir),
            healthy=healthy,
            rpc_url=state.rpc_url or f"tcp://{state.host}:{state.port}",
            http_url=state.http_url,
            report=report_from_status(status) if status else None,
            reason=None if healthy else f"/healthcheck says {health or 'nothing'}",
            resp_peer_gone=None
            if state.resp_peer is None or is_alive(state.resp_peer.pid, state.resp_peer.start_ticks)
            else _peer_gone(state.resp_peer),
            runs_until_stop=state.runs_until_stop,
            leases=list(self.leases.live(tidy=tidy).values()),
            coordinator_url=state.wiring.coordinator_url,
        )


def _peer_gone(peer: RespPeer) -> str:
    return (
        f"the engine (pid {peer.pid}) whose RESP wire {peer.address} the resp L2 adapter "
        "connected to has stopped or restarted since this server started; the adapter never "
        "reconnects, so L2 stores fail and lookups can hang: start the engine (with resp), then "
        "restart the lmcache server"
    )


def _flag_int(argv: list[str], flag: str) -> int:
    """The integer after `flag` in a planned argv."""
    try:
        return int(argv[argv.index(flag) + 1])
    except (ValueError, IndexError):
        raise LmcacheProcessError(f"the lmcache server plan has no {flag} value") from None
