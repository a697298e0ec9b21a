"""Ask the engine's RESP wire whether it answers: connect, `AUTH user password`, `PING`.

LMCache's `resp` adapter connects once, when the `lmcache server` starts, and never reconnects;
a server started while this check fails hangs every request that reaches L2. So the stack runs
this check before it starts such a server.
"""

from __future__ import annotations

import socket
import time

from pydantic import SecretStr

from graph_kvcache_mcp.domain.engine.resp import resp_command, simple_reply
from graph_kvcache_mcp.domain.outcomes import Unavailable


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
