"""The managed local engine: a real `epistemic-graph-server` on loopback, started and stopped by us.

Layout under `<data_dir>/engine/` (directories 0700, files 0600): `state.json` (what we started),
`token`, `auth_secret`, `signer_key` (generated once and reused so configured clients keep
working), `engine.log`, `leases/` (one file per server session using the engine, see
`processes/leases`), `lifecycle.lock`, and `store/` (the engine's persist dir; one engine per dir,
the engine locks it). Started with `resp=True` the engine also opens its Redis (RESP) wire on a
free loopback port (`EPISTEMIC_GRAPH_REDIS_ADDR`), recorded as `resp_port`; its per-user password
derives from `auth_secret` (`resp_credentials`). The engine runs with umask 077 and an
environment of its own variables only, so its store is private and it never sees our other
secrets.

Readiness is an authenticated `GET /kv/stats` = 200: the engine keeps running when its KV listener
fails (port taken, bad token), so a live pid proves nothing. The token goes to the port only once
the listening socket there is proved to be the engine's own (`readiness.listener_refusal`): a
process that bound the port first (a squatter racing the start) gets no request at all; the start
fails, naming it, the engine is stopped and the token is rotated. `readiness` holds those checks.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.readiness import (
    ENGINE_HOST,
    StartNote,
    listener_refusal,
    log_size,
    wait_ready,
    wait_resp,
)
from graph_kvcache_mcp.connectors.engine.state import (
    Backend,
    EngineState,
    EngineStatus,
    EngineStopResult,
    RespCredentials,
)
from graph_kvcache_mcp.connectors.files.private import (
    exclusive,
    narrow_tree,
    new_secret,
    private_dir,
    secret_file,
    write_private,
)
from graph_kvcache_mcp.connectors.processes.control import (
    OS_INHERITED,
    OS_INHERITED_PREFIXES,
    inherited_environment,
    spawn_logged,
    stop_process,
)
from graph_kvcache_mcp.connectors.processes.lease_rules import (
    LeasedLifecycle,
    keep_until_stop,
)
from graph_kvcache_mcp.connectors.processes.leases import Leases
from graph_kvcache_mcp.connectors.processes.ports import free_port, wait_port_free
from graph_kvcache_mcp.connectors.processes.state_file import StateFile
from graph_kvcache_mcp.connectors.processes.status import running_fields
from graph_kvcache_mcp.domain.engine.environment import KV_TOKEN_ENV
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.engine.resp import RESP_USER, resp_password
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError

DEFAULT_READY_TIMEOUT_S = 30.0
PORT_RELEASE_GRACE_S = 1.0
"""After a crash the kernel frees the listening port ~0.1 s after the process is reaped."""
_INSTALL_HINT = "install it with: pip install 'graph-kvcache-mcp[engine]' (epistemic-graph-server)"


# What the engine process may inherit from us: what the OS and its runtime need, nothing else.
# Everything the engine itself reads is set explicitly in `ManagedEngine._environment`.
_INHERITED = OS_INHERITED | {"RUST_LOG", "RUST_BACKTRACE"}


def engine_binary() -> Path:
    """Path of the `epistemic-graph-server` binary from the installed wheel.

    Raises:
        EngineProcessError: the package is not installed or ships no binary.
    """
    try:
        import epistemic_graph_server
    except ImportError:
        raise EngineProcessError(
            f"epistemic-graph-server is not installed; {_INSTALL_HINT}"
        ) from None
    path = Path(epistemic_graph_server.binary_path())
    if not path.exists():
        raise EngineProcessError(f"engine binary missing at {path}; reinstall it: {_INSTALL_HINT}")
    return path


class ManagedEngine(LeasedLifecycle[EngineStopResult]):
    """Start, find, check and stop the engine that lives under one data dir."""

    TERM_WAIT_S = 10.0

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self.home = self.data_dir / "engine"
        self.state_path = self.home / "state.json"
        self.state_file = StateFile(self.state_path, EngineState)
        self.log_path = self.home / "engine.log"
        self.store_dir = self.home / "store"
        self.leases = Leases(self.home / "leases")

    def __repr__(self) -> str:
        return f"ManagedEngine({str(self.data_dir)!r})"

    # --- secrets -----------------------------------------------------------------------------

    def token(self) -> SecretStr:
        """The bearer token clients use (created on first use, 0600)."""
        return SecretStr(self._secret("token", new_secret))

    @property
    def token_path(self) -> Path:
        """The file holding the bearer token (0600, ours)."""
        return self.home / "token"

    def existing_token(self) -> SecretStr | None:
        """The bearer token when one was made already; creates nothing (read-only use)."""
        value = secret_file(self.token_path)
        return SecretStr(value) if value is not None else None

    def rotate_token(self) -> None:
        """Replace the bearer token with a new one (after it may have reached a stranger)."""
        self._make_home()
        write_private(self.home / "token", new_secret())

    def resp_credentials(self, user: str = RESP_USER) -> RespCredentials | None:
        """How to authenticate to the running engine's RESP wire as `user`; None when no
        managed engine runs or it was started without the wire."""
        state = self.running_state(tidy=False)
        secret = secret_file(self.home / "auth_secret")
        if state is None or state.resp_port is None or secret is None:
            return None
        return RespCredentials(
            host=ENGINE_HOST,
            port=state.resp_port,
            user=user,
            password=SecretStr(resp_password(secret, user)),
        )

    def _secret(self, name: str, make: Callable[[], str]) -> str:
        self._make_home()
        value = secret_file(self.home / name, make)
        if value is None:  # pragma: no cover - secret_file creates the file or raises
            raise EngineProcessError(f"could not create {self.home / name}")
        return value

    # --- state -------------------------------------------------------------------------------

    def state(self) -> EngineState | None:
        """The recorded engine, when the record exists and is readable."""
        return self.state_file.read()

    def running_state(self, *, tidy: bool = True) -> EngineState | None:
        """The recorded engine when it is still the process we started; a stale record is
        cleared when `tidy` (read-only callers leave everything as it is)."""
        return self.state_file.read_live(tidy=tidy)

    def client(self, state: EngineState, *, timeout_s: float = 5.0) -> SyncKvClient:
        return SyncKvClient(
            state.base_url,
            self.existing_token(),
            timeout_s=timeout_s,
            token_file=self.token_path,
        )

    # --- lifecycle ---------------------------------------------------------------------------

    def start(
        self,
        *,
        port: int | None = None,
        backend: Backend = "durable",
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        progress: StartNote | None = None,
        runs_until_stop: bool = True,
        resp: bool = False,
    ) -> EngineStatus:
        """Ensure an engine runs for this data dir; reuse a healthy one we started before.
        `resp` opens its RESP wire too (a running engine without one is refused, not restarted).

        Two callers starting at once (a CLI and a server, say) are serialized on a lock file, so
        the second one finds and reuses the first one's engine instead of racing it. A new
        engine records `runs_until_stop`: server sessions pass False, so the last session to
        release it stops it (`release`); otherwise only `stop` ends it.

        Raises:
            EngineProcessError: binary missing, port taken, data dir locked, or not ready in time;
                the message quotes the engine's own reason from its log.
        """
        with self._exclusive():
            return self._start(port, backend, ready_timeout_s, progress, runs_until_stop, resp)

    def _start(
        self,
        port: int | None,
        backend: Backend,
        ready_timeout_s: float,
        progress: StartNote | None,
        runs_until_stop: bool,
        resp: bool,
    ) -> EngineStatus:
        note = progress or (lambda _message: None)
        # A record whose process is gone: the engine died (killed, crashed) without `stop`. Its
        # port was free for anyone since, and children kept sending the token to it until they
        # saw it go: the next engine gets a new token.
        unclean = self.state() is not None and self.running_state(tidy=False) is None
        if (state := self.running_state()) is not None:
            status = self.status()
            if resp and state.resp_port is None:
                raise EngineProcessError(
                    f"the managed engine (pid {state.process.pid}) runs without its RESP wire; "
                    "stop it (engine_stop, or `graph-kvcache-mcp engine stop`) and start it "
                    "again with resp"
                )
            if status.reachable:
                note(f"engine already running (pid {state.process.pid}, port {state.port})")
                if runs_until_stop:
                    # `engine start` on a session's engine: from now on it runs until `engine stop`.
                    keep_until_stop(self.state_file, state)
                    status = status.model_copy(update={"runs_until_stop": True})
                return status.model_copy(update={"reused": True})
            raise EngineProcessError(
                f"an engine we started (pid {state.process.pid}) runs but does not answer on "
                f"port {state.port}: {status.reason}. Stop it with engine_stop (force=true) or "
                f"`graph-kvcache-mcp engine stop --data-dir {self.data_dir}` and start again"
            )
        binary = engine_binary()
        if unclean:
            self.rotate_token()
        chosen = port or free_port(ENGINE_HOST)
        if not wait_port_free(ENGINE_HOST, chosen, PORT_RELEASE_GRACE_S):
            raise EngineProcessError(
                f"port {chosen} on {ENGINE_HOST} is already in use by another process; "
                "choose another with --port (or omit it to pick a free one)"
            )
        private_dir(self.store_dir)
        narrow_tree(self.home)  # a store or log an older version left 0644
        self.remove_socket()  # one a killed engine left would refuse the new one's bind
        command = (str(binary), "--socket-path", str(self.socket_path))
        note(f"starting engine on {ENGINE_HOST}:{chosen} ({backend} backend)")
        log_offset = log_size(self.log_path)
        resp_port = free_port(ENGINE_HOST) if resp else None
        process, record = spawn_logged(
            command, env=self._environment(chosen, backend, resp_port), log_path=self.log_path
        )
        state = EngineState(
            process=record,
            port=chosen,
            backend=backend,
            base_url=f"http://{ENGINE_HOST}:{chosen}",
            data_dir=str(self.data_dir),
            runs_until_stop=runs_until_stop,
            resp_port=resp_port,
        )
        self.state_file.write(state)
        began = time.monotonic()
        wait_ready(self, process, state, ready_timeout_s, note, log_offset)
        if resp_port is not None:
            wait_resp(self, state, max(1.0, ready_timeout_s - (time.monotonic() - began)))
        note(f"engine ready at {state.base_url}")
        return self.status()

    def _stop(self, term_wait_s: float) -> EngineStopResult:
        state = self.running_state()
        if state is None:
            return EngineStopResult(stopped=False, how="not_running", data_dir=str(self.data_dir))
        how = stop_process(state.process, term_wait_s=term_wait_s)
        self.state_file.clear()
        self.remove_socket()
        return EngineStopResult(
            stopped=how != "not_running",
            how=how,
            pid=state.process.pid,
            data_dir=str(self.data_dir),
        )

    @property
    def socket_path(self) -> Path:
        """The engine's unix socket (its local admin channel), removed once it stops."""
        return self.home / "engine.sock"

    def remove_socket(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(self.socket_path.lstat().st_mode):
                self.socket_path.unlink()

    def status(self, *, tidy: bool = True) -> EngineStatus:
        """Whether our engine runs and answers, with pid, port, backend, uptime and the live
        leases; stale records and leases are removed on the way when `tidy`."""
        state = self.running_state(tidy=tidy)
        leases = list(self.leases.live(tidy=tidy).values())
        if state is None:
            return EngineStatus(
                running=False,
                data_dir=str(self.data_dir),
                leases=leases,
                reason=f"no managed engine runs for {self.data_dir}; start one with engine_start "
                "(CLI: `graph-kvcache-mcp engine start`)",
            )
        if (impostor := self.impostor(state)) is not None:
            stats: EngineStats | Unavailable = Unavailable(impostor)
        else:
            with self.client(state, timeout_s=2.0) as client:
                stats = client.engine_stats()
        reachable = not isinstance(stats, Unavailable)
        return EngineStatus(
            **running_fields(state.process, self.data_dir),
            reachable=reachable,
            port=state.port,
            base_url=state.base_url,
            backend=stats.backend
            if not isinstance(stats, Unavailable) and stats.backend != "unknown"
            else state.backend,
            resp_address=None if state.resp_port is None else f"{ENGINE_HOST}:{state.resp_port}",
            reason=stats.reason if isinstance(stats, Unavailable) else None,
            runs_until_stop=state.runs_until_stop,
            leases=leases,
        )

    def impostor(self, state: EngineState) -> str | None:
        """Why the token must not go to `EngineState.port` (None when our engine holds that port's
        listening socket): nothing listens there yet, or another process does."""
        return listener_refusal(state, state.port, what="port", secret="token")

    def resp_impostor(self, state: EngineState) -> str | None:
        """Why the RESP password must not go to `EngineState.resp_port` (None when our engine holds
        that port's listening socket), as `impostor` says for the HTTP token."""
        if state.resp_port is None:
            return "the engine runs without its RESP wire"
        return listener_refusal(state, state.resp_port, what="RESP port", secret="RESP password")

    def abandon(self, state: EngineState, *, rotate_token: bool = False) -> None:
        """Stop the engine of a failed start and clear its record (and rotate the token when it
        may have reached a port we could not trust)."""
        stop_process(state.process, term_wait_s=5.0)
        self.state_file.clear()
        self.remove_socket()
        if rotate_token:
            self.rotate_token()

    # --- internals ---------------------------------------------------------------------------

    def _make_home(self) -> None:
        private_dir(self.data_dir)
        private_dir(self.home)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold `<home>/lifecycle.lock` (flock) so start, stop and release never interleave."""
        self._make_home()
        with exclusive(self.home / "lifecycle.lock"):
            yield

    def _environment(self, port: int, backend: Backend, resp_port: int | None) -> dict[str, str]:
        signer = self._secret("signer_key", lambda: secrets.token_hex(16))
        env = inherited_environment(_INHERITED, OS_INHERITED_PREFIXES)
        env.update(
            GRAPH_SERVICE_AUTH_SECRET=self._secret("auth_secret", new_secret),
            GRAPH_SERVICE_PERSIST_DIR=str(self.store_dir),
            EPISTEMIC_GRAPH_AUDIENCE="epistemic-graph",
            EPISTEMIC_GRAPH_TENANT="tenant:local",
            EPISTEMIC_GRAPH_POLICY_VERSION="policy:initial",
            EPISTEMIC_GRAPH_REQUIRE_OIDC="false",
            EPISTEMIC_GRAPH_SIGNER_KEYS_JSON=json.dumps({"service:local": signer}),
            EPISTEMIC_GRAPH_KVCACHE_ADDR=f"{ENGINE_HOST}:{port}",
        )
        env[KV_TOKEN_ENV] = self.token().get_secret_value()
        if backend == "durable":
            env["EPISTEMIC_GRAPH_KVCACHE_BACKEND"] = "durable"
        if resp_port is not None:
            env["EPISTEMIC_GRAPH_REDIS_ADDR"] = f"{ENGINE_HOST}:{resp_port}"
        return env
