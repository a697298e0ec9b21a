"""When a started engine counts as ready, and why a start has failed although the engine runs.

Readiness is an authenticated `GET /kv/stats` = 200, asked only once the port's listening socket
is proved to be the engine's own (`listener_refusal`): a squatter that bound the port first gets
no request at all. A failed bind in the engine's log since this start (`Address already in use`)
is a failed start too. With its RESP wire, the engine must also answer AUTH + PING there, under
the same listener proof. Every failure stops the engine (`ManagedEngine.abandon`) and says why,
quoting the engine's log.

`resp_ping` asks the RESP wire (connect, `AUTH user password`, `PING`) on its own as well:
LMCache's `resp` adapter connects once, when the `lmcache server` starts, and never reconnects,
so the stack runs it before it starts such a server.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine.state import EngineState
from graph_kvcache_mcp.connectors.processes.control import tail
from graph_kvcache_mcp.connectors.processes.identity import (
    ListenerOwner,
    describe_listener,
    listener_owner,
)
from graph_kvcache_mcp.domain.engine.resp import resp_command, simple_reply
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError

if TYPE_CHECKING:
    from graph_kvcache_mcp.connectors.engine.process import ManagedEngine

ENGINE_HOST = "127.0.0.1"
BIND_FAILED = "Address already in use"
StartNote = Callable[[str], None]


def wait_ready(
    engine: ManagedEngine,
    process: subprocess.Popen[bytes],
    state: EngineState,
    timeout_s: float,
    note: StartNote,
    log_offset: int,
) -> None:
    """Return once the engine we started answers on its own port; else stop it and raise.

    Raises:
        EngineProcessError: it exited, another process took its port, its bind failed, or it
            did not answer within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    last_reason = "no answer yet"
    next_note = time.monotonic() + 2.0
    with engine.client(state, timeout_s=1.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                engine.state_file.clear()
                raise EngineProcessError(
                    f"engine exited with code {process.returncode} before it was ready: "
                    f"{engine_reason(engine.log_path)} (log: {engine.log_path})"
                )
            # One look at the port per round: listing its listeners reads every process's sockets.
            owner = listener_owner(state.process.pid, state.port, host=ENGINE_HOST)
            if (refusal := start_refusal(state, owner, engine.log_path, log_offset)) is not None:
                engine.abandon(state, rotate_token=True)
                raise EngineProcessError(refusal)
            if owner == "none":  # not bound yet (a foreign owner was refused just above)
                last_reason = f"nothing listens on port {state.port} yet"
                time.sleep(0.02)
                continue
            stats = client.engine_stats()
            if not isinstance(stats, Unavailable):
                return
            last_reason = stats.reason
            if time.monotonic() >= next_note:
                note(f"waiting for the engine's KV port {state.port} ...")
                next_note += 2.0
            time.sleep(0.05)
    engine.abandon(state)
    raise EngineProcessError(
        f"engine did not answer on port {state.port} within {timeout_s:g} s ({last_reason}); "
        f"its log says: {engine_reason(engine.log_path)} (log: {engine.log_path})"
    )


def wait_resp(engine: ManagedEngine, state: EngineState, timeout_s: float) -> None:
    """The RESP wire answers AUTH + PING, or the engine is stopped and the start fails.

    Raises:
        EngineProcessError: another process holds the RESP port, or it did not answer in time.
    """
    credentials = engine.resp_credentials()
    assert credentials is not None  # the state just written records the port
    deadline = time.monotonic() + timeout_s
    # Wait only while nothing listens yet: a squatter is refused at once.
    while time.monotonic() < deadline:
        if listener_owner(state.process.pid, credentials.port, host=ENGINE_HOST) != "none":
            break
        time.sleep(0.05)
    if (why := engine.resp_impostor(state)) is not None:
        engine.abandon(state)
        raise EngineProcessError(f"the engine's RESP wire cannot be trusted: {why}")
    failed = wait_resp_ready(
        credentials.host,
        credentials.port,
        credentials.user,
        credentials.password,
        timeout_s=timeout_s,
    )
    if failed is None:
        return
    engine.abandon(state)
    raise EngineProcessError(
        f"{failed.reason} within {timeout_s:g} s; its log says: "
        f"{engine_reason(engine.log_path)} (log: {engine.log_path})"
    )


def start_refusal(
    state: EngineState, owner: ListenerOwner, log_path: Path, log_offset: int
) -> str | None:
    """Why this start has failed although the engine runs: another process holds its port
    (`owner`), or the engine's log (since `log_offset`) reports that its bind failed."""
    if owner == "foreign":
        return (
            f"port {state.port} on {ENGINE_HOST} was taken by another process "
            f"({describe_listener(state.port, host=ENGINE_HOST)}) while the engine started; "
            "the engine was stopped, no token was sent there and the token was rotated. Start "
            "again (a fixed --port: choose another)"
        )
    if BIND_FAILED in log_since(log_path, log_offset):
        return (
            f"the engine could not bind port {state.port} on {ENGINE_HOST} ({BIND_FAILED}); "
            "it was stopped and the token was rotated. Start again (a fixed --port: choose "
            f"another) (log: {log_path})"
        )
    return None


def listener_refusal(state: EngineState, port: int, *, what: str, secret: str) -> str | None:
    """Why `secret` must not go to `port` (None when the engine we started holds its listening
    socket): nothing listens there yet, or another process does."""
    owner = listener_owner(state.process.pid, port, host=ENGINE_HOST)
    if owner == "ours":
        return None
    if owner == "none":
        return f"nothing listens on {what} {port} yet"
    return (
        f"{what} {port} is held by another process "
        f"({describe_listener(port, host=ENGINE_HOST)}), not by the engine we started "
        f"(pid {state.process.pid}); the {secret} was not sent"
    )


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_since(path: Path, offset: int, *, max_bytes: int = 64 * 1024) -> str:
    """What the log gained since `offset` (its first `max_bytes`)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(max_bytes).decode(errors="replace")
    except OSError:
        return ""


def engine_reason(log_path: Path) -> str:
    """The most telling line of the engine's log: its last ERROR line, else its last line."""
    lines = [line for line in tail(log_path, 60).splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "error" in line.lower()]
    chosen = (errors or lines or ["(empty log)"])[-1]
    return chosen.strip()[-300:]


def resp_ping(
    host: str, port: int, user: str, password: SecretStr, *, timeout_s: float = 3.0
) -> Unavailable | None:
    """None when the wire at host:port accepts `user` and answers PING with PONG; otherwise
    why not (the password never appears in the reason)."""
    where = f"the engine's RESP wire at {host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            reader = conn.makefile("rb")
            conn.sendall(resp_command("AUTH", user, password.get_secret_value()))
            ok, text = simple_reply(reader.readline())
            if not ok:
                return Unavailable(f"{where} refused AUTH for user {user!r}: {text}")
            conn.sendall(resp_command("PING"))
            ok, text = simple_reply(reader.readline())
    except OSError as exc:
        return Unavailable(f"{where} did not answer ({exc.strerror or exc})")
    if not ok or text != "PONG":
        return Unavailable(f"{where} answered PING with {text!r}")
    return None


def wait_resp_ready(
    host: str, port: int, user: str, password: SecretStr, *, timeout_s: float
) -> Unavailable | None:
    """`resp_ping` until it succeeds or `timeout_s` passes; the last failure otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        failed = resp_ping(host, port, user, password, timeout_s=min(3.0, timeout_s))
        if failed is None or time.monotonic() >= deadline:
            return failed
        time.sleep(0.05)  # polling a port under a deadline
