"""The host's managed TLS edge: one haproxy per data dir, started, checked, rotated and stopped
by us.

Layout under `<data_dir>/edge/` (directories 0700, files 0600): `state.json` (what we started),
`haproxy.cfg` (rendered from the routes, `domain.edge.haproxy`), `tls/host.pem` (certificate and
key, the one file haproxy's `crt` names) and `tls/ca.pem` (private copies of the TLS dir, so a
later change there reaches the edge only through `rotate`), `edge.log`, `stats.sock` (the
runtime API, level admin, 0600), and `lifecycle.lock`.

Start: `haproxy -Ws -f haproxy.cfg` in its own session with an environment of the OS basics
only; ready once it sends READY=1 on our notify socket AND every listener of every route is held
by its process group (a squatter that bound one first fails the start, naming it). The edge runs
until `stop`: no server session shares it, so it takes no leases. Stop signals only the process
group we started (`stop_process` checks the record's identity first). Rotate swaps the host
certificate through the runtime API, never a reload (a reload with a live TCP-mode TLS
connection crashed haproxy 2.6's old worker).
"""

from __future__ import annotations

import re
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from graph_kvcache_mcp.connectors.edge.haproxy import (
    check_socket_path,
    haproxy_binary,
    notify_socket,
    served_serial,
    swap_certificate,
    wait_notified_ready,
)
from graph_kvcache_mcp.connectors.edge.state import (
    EdgeRotateOut,
    EdgeState,
    EdgeStatus,
    EdgeStopResult,
)
from graph_kvcache_mcp.connectors.files.pki import TlsBundle, describe_pem, load_tls_dir
from graph_kvcache_mcp.connectors.files.private import (
    exclusive,
    private_dir,
    read_private,
    remove_own,
    write_private,
)
from graph_kvcache_mcp.connectors.processes.control import (
    OS_INHERITED,
    OS_INHERITED_PREFIXES,
    inherited_environment,
    spawn_logged,
    stop_process,
)
from graph_kvcache_mcp.connectors.processes.identity import describe_listener, listener_owner
from graph_kvcache_mcp.connectors.processes.state_file import StateFile
from graph_kvcache_mcp.connectors.processes.status import running_fields
from graph_kvcache_mcp.domain.edge.haproxy import EdgeFiles, render
from graph_kvcache_mcp.domain.edge.routes import EdgeRoutes, Route
from graph_kvcache_mcp.domain.plain_text import plain_text
from graph_kvcache_mcp.errors import ConfigError, EdgeProcessError

DEFAULT_READY_TIMEOUT_S = 15.0
LISTENER_WAIT_S = 5.0
_ALERT_PREFIX = re.compile(r"^\[ALERT\]\s*\(\d+\)\s*:\s*")


class ManagedEdge:
    """Start, find, check, rotate and stop the edge that lives under one data dir."""

    TERM_WAIT_S = 10.0

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self.home = self.data_dir / "edge"
        self.state_file = StateFile(self.home / "state.json", EdgeState)
        self.log_path = self.home / "edge.log"
        self.config_path = self.home / "haproxy.cfg"
        self.stats_socket = self.home / "stats.sock"
        self.notify_path = self.home / "notify.sock"
        self.certificate_path = self.home / "tls" / "host.pem"
        self.ca_path = self.home / "tls" / "ca.pem"

    def __repr__(self) -> str:
        return f"ManagedEdge({str(self.data_dir)!r})"

    def running_state(self, *, tidy: bool = True) -> EdgeState | None:
        """The recorded edge when it is still the process we started."""
        return self.state_file.read_live(tidy=tidy)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(
        self,
        routes: EdgeRoutes,
        tls_dir: Path,
        *,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ) -> EdgeStatus:
        """Ensure an edge with `routes` runs for this data dir, presenting the certificate in
        `tls_dir`; one already running with the same routes is reused.

        Raises:
            EdgeProcessError: haproxy missing, an edge with other routes running, a listener
                taken, or not ready in time (quoting haproxy's log).
            ConfigError: the TLS dir is incomplete, not ours, or its certificate is not its CA's.
        """
        with self._exclusive():
            if (state := self.running_state()) is not None:
                if state.routes != routes:
                    raise EdgeProcessError(
                        f"an edge with other routes already runs for {self.data_dir} (pid "
                        f"{state.process.pid}); stop it first (`graph-kvcache-mcp edge stop`)"
                    )
                return self.status().model_copy(update={"reused": True})
            return self._start(routes, tls_dir, ready_timeout_s)

    def ensure(
        self,
        routes: EdgeRoutes,
        tls_dir: Path,
        *,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ) -> EdgeStatus:
        """Ensure the edge carries `routes` (and whatever it carried): started with them when
        none runs, reused when it carries them already, else restarted with the union, which
        drops the connections it held (no reload: see the module docstring).

        Raises:
            ConfigError: the running edge presents another TLS dir's certificate, or `tls_dir`
                cannot be used.
            InvalidValue: a route listens where a different route of the edge does.
            EdgeProcessError: as `start`.
        """
        with self._exclusive():
            state = self.running_state()
            if state is None:
                return self._start(routes, tls_dir, ready_timeout_s)
            if Path(state.tls_dir).resolve() != tls_dir.expanduser().resolve():
                raise ConfigError(
                    f"the edge of {self.data_dir} runs with the TLS dir {state.tls_dir}, not "
                    f"{tls_dir}: give that one (one host, one certificate), or stop the edge "
                    "first (`graph-kvcache-mcp edge stop`)"
                )
            if state.routes.carries(routes):
                return self.status().model_copy(update={"reused": True})
            merged = state.routes.union(routes)
            return self._restart(state, merged, ready_timeout_s)

    def withdraw(
        self,
        unwanted: Callable[[Route], bool],
        *,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ) -> EdgeStatus | None:
        """Drop the routes `unwanted` picks: the edge restarts with the rest (dropping the
        connections it held), or stops when none is left. None when no edge runs or it carries
        no such route (nothing was done).

        Raises:
            EdgeProcessError: the restarted edge did not come up (see `start`).
        """
        with self._exclusive():
            state = self.running_state()
            if state is None or not any(unwanted(route) for route in state.routes.all()):
                return None
            kept = state.routes.without(unwanted)
            if kept is None:
                stop_process(state.process, term_wait_s=self.TERM_WAIT_S)
                self._forget()
                return EdgeStatus(
                    running=False,
                    data_dir=str(self.data_dir),
                    restarted=False,
                    reason="stopped: it carried no other route",
                )
            return self._restart(state, kept, ready_timeout_s)

    def stop(self, *, term_wait_s: float = TERM_WAIT_S) -> EdgeStopResult:
        """Stop the edge we started (its whole process group); nothing else is signalled."""
        with self._exclusive():
            state = self.running_state()
            if state is None:
                return EdgeStopResult(stopped=False, how="not_running", data_dir=str(self.data_dir))
            how = stop_process(state.process, term_wait_s=term_wait_s)
            self._forget()
            return EdgeStopResult(
                stopped=how != "not_running",
                how=how,
                pid=state.process.pid,
                data_dir=str(self.data_dir),
            )

    def rotate(self, tls_dir: Path) -> EdgeRotateOut:
        """Serve the certificate now in `tls_dir` from the next handshake on, with no reload:
        live connections (feeds) stay up. The CA must be the one the edge trusts.

        Raises:
            EdgeProcessError: no edge runs, the CA differs (that needs a restart), or haproxy
                refused the certificate.
            ConfigError: the TLS dir is incomplete, not ours, or inconsistent.
        """
        with self._exclusive():
            state = self.running_state()
            if state is None:
                raise EdgeProcessError(
                    f"no managed edge runs for {self.data_dir}; start one with `edge start`"
                )
            bundle = load_tls_dir(tls_dir, now=datetime.now(UTC))
            if bundle.ca_pem.strip() != (read_private(self.ca_path) or "").strip():
                raise EdgeProcessError(
                    f"{tls_dir}/ca.pem is another CA than the one the edge trusts; a new fleet CA "
                    "needs every edge restarted (`edge stop`, then `edge start`)"
                )
            previous = served_serial(self.stats_socket, self.certificate_path)
            swap_certificate(self.stats_socket, self.certificate_path, bundle.haproxy_pem())
            # The private copy follows, so a later start presents the same certificate.
            write_private(self.certificate_path, bundle.haproxy_pem())
            self.state_file.write(state.model_copy(update={"tls_dir": str(tls_dir)}))
            return EdgeRotateOut(
                rotated=True,
                previous_serial=previous,
                certificate=bundle.summary,
                served_serial=served_serial(self.stats_socket, self.certificate_path),
            )

    def status(self) -> EdgeStatus:
        """Whether our edge runs, holds every listener and answers on its runtime API. The
        record of an edge that died is left for the next start or stop to replace: it is the
        only trace of the routes it carried, which the answer names."""
        recorded = self.state_file.read()
        state = self.running_state(tidy=False)
        if state is None:
            why = (
                f"no managed edge runs for {self.data_dir}; start one with "
                "`graph-kvcache-mcp edge start`"
                if recorded is None
                else _gone(recorded, self.data_dir)
            )
            return EdgeStatus(running=False, data_dir=str(self.data_dir), reason=why)
        reason = self._listener_refusal(state)
        serial: str | None = None
        if reason is None:
            try:
                serial = served_serial(self.stats_socket, self.certificate_path)
            except EdgeProcessError as exc:
                reason = str(exc)
        # What the edge was given (its private copies), not what the TLS dir holds by now.
        served = read_private(self.certificate_path)
        trusted = read_private(self.ca_path)
        certificate = describe_pem(served, trusted) if served and trusted else None
        return EdgeStatus(
            **running_fields(state.process, self.data_dir),
            reachable=reason is None,
            reason=reason,
            routes=state.routes,
            certificate=certificate,
            served_serial=serial,
            config_path=state.config_path,
        )

    # --- internals ---------------------------------------------------------------------------

    def _start(self, routes: EdgeRoutes, tls_dir: Path, ready_timeout_s: float) -> EdgeStatus:
        binary = haproxy_binary()
        bundle = load_tls_dir(tls_dir, now=datetime.now(UTC))
        self._refuse_taken(routes)
        self._write_files(routes, bundle)
        return self._spawn(binary, routes, tls_dir, ready_timeout_s)

    def _restart(self, state: EdgeState, routes: EdgeRoutes, ready_timeout_s: float) -> EdgeStatus:
        """The edge stopped and started again with `routes` (its TLS dir checked first, so a bad
        one leaves the running edge as it was)."""
        tls_dir = Path(state.tls_dir)
        load_tls_dir(tls_dir, now=datetime.now(UTC))
        stop_process(state.process, term_wait_s=self.TERM_WAIT_S)
        self._forget()
        started = self._start(routes, tls_dir, ready_timeout_s)
        return started.model_copy(update={"restarted": True})

    def _spawn(
        self, binary: Path, routes: EdgeRoutes, tls_dir: Path, ready_timeout_s: float
    ) -> EdgeStatus:
        env = inherited_environment(OS_INHERITED, OS_INHERITED_PREFIXES)
        with notify_socket(self.notify_path) as receiver:
            env["NOTIFY_SOCKET"] = str(self.notify_path)
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            process, record = spawn_logged(
                (str(binary), "-Ws", "-f", str(self.config_path)),
                env=env,
                log_path=self.log_path,
            )
            state = EdgeState(
                process=record,
                routes=routes,
                config_path=str(self.config_path),
                stats_socket=str(self.stats_socket),
                certificate_path=str(self.certificate_path),
                tls_dir=str(tls_dir),
            )
            self.state_file.write(state)
            failed = wait_notified_ready(receiver, process, ready_timeout_s)
        if failed is None:
            failed = self._wait_listeners(state)
        if failed is not None:
            stop_process(state.process, term_wait_s=5.0)
            self._forget()
            raise EdgeProcessError(
                f"{failed}; haproxy says: {_haproxy_reason(self.log_path, log_offset)} "
                f"(log: {self.log_path}, config: {self.config_path})"
            )
        return self.status()

    def _wait_listeners(self, state: EdgeState) -> str | None:
        deadline = time.monotonic() + LISTENER_WAIT_S
        while (reason := self._listener_refusal(state)) is not None:
            if "another process" in reason or time.monotonic() >= deadline:
                return reason
            time.sleep(0.05)
        return None

    def _listener_refusal(self, state: EdgeState) -> str | None:
        """Why the edge's listeners are not all its own (None when they are)."""
        for host, port in state.routes.listeners():
            owner = listener_owner(state.process.pid, port, group=True, host=host)
            if owner == "none":
                return f"nothing listens on {host}:{port} yet"
            if owner == "foreign":
                return (
                    f"port {port} is held by another process ({describe_listener(port)}), not "
                    f"by the edge we started (pid {state.process.pid})"
                )
        return None

    def _refuse_taken(self, routes: EdgeRoutes) -> None:
        for host, port in routes.listeners():
            if listener_owner(-1, port, host=host) != "none":
                raise EdgeProcessError(
                    f"port {port} is already in use ({describe_listener(port)}); the edge "
                    f"cannot listen on {host}:{port}. Free it or choose another port"
                )

    def _write_files(self, routes: EdgeRoutes, bundle: TlsBundle) -> None:
        private_dir(self.certificate_path.parent)
        check_socket_path(self.stats_socket)
        files = EdgeFiles(
            certificate=self.certificate_path, ca=self.ca_path, stats_socket=self.stats_socket
        )
        config = render(routes, files)
        write_private(self.certificate_path, bundle.haproxy_pem())
        write_private(self.ca_path, bundle.ca_pem)
        write_private(self.config_path, config)
        remove_own(self.stats_socket, stat.S_ISSOCK)

    def _forget(self) -> None:
        self.state_file.clear()
        remove_own(self.stats_socket, stat.S_ISSOCK)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        private_dir(self.data_dir)
        private_dir(self.home)
        with exclusive(self.home / "lifecycle.lock"):
            yield


def _haproxy_reason(log_path: Path, offset: int) -> str:
    """What haproxy said of this start: its ALERT lines since `offset` (the first three, which
    name the cause; the last one only says it exits), else the last line of its log."""
    try:
        with log_path.open("rb") as handle:
            handle.seek(offset)
            text = plain_text(handle.read(64 * 1024).decode(errors="replace"))
    except OSError:
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    alerts = [_ALERT_PREFIX.sub("", line) for line in lines if line.startswith("[ALERT]")]
    return "; ".join(alerts[:3])[:600] if alerts else (lines or ["(empty log)"])[-1][-300:]


def _gone(recorded: EdgeState, data_dir: Path) -> str:
    """Why no edge runs when one was recorded: it died without `edge stop`. Its routes are
    named, since nothing restarts it: the commands that published them, run again, add them
    back (each adds its own), or `edge start` with them all."""
    routes = ", ".join(route.spec for route in recorded.routes.all())
    return (
        f"the edge of {data_dir} (pid {recorded.process.pid}) is gone without `edge stop` "
        f"(killed or crashed); it carried {routes}. Run again the commands that published "
        "them (`engine start --listen`, `lmcache coordinator start --listen ... --node ...` "
        "with every node, `vllm start ... --listen`), or `edge start` with these routes"
    )
