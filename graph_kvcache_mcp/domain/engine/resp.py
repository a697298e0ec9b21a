"""The engine's Redis (RESP) wire: its per-user password and the few frames we speak. Pure.

The engine opens the wire when started with `EPISTEMIC_GRAPH_REDIS_ADDR`; it authenticates every
connection with `AUTH user password`, where the password for `user` is
HMAC-SHA256(key = the engine's `GRAPH_SERVICE_AUTH_SECRET`, msg = "redis:" + user) in hex. Its
keyspace is its own (not `/kv`): values stored over RESP never show in `/kv/stats`.
"""

from __future__ import annotations

import hashlib
import hmac

RESP_USER = "lmcache"
"""The RESP user the managed `lmcache server` authenticates as."""


def resp_password(auth_secret: str, user: str) -> str:
    """The engine's RESP password for `user` (hex HMAC-SHA256 of "redis:" + user)."""
    return hmac.new(auth_secret.encode(), f"redis:{user}".encode(), hashlib.sha256).hexdigest()


def resp_command(*args: str) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def simple_reply(line: bytes) -> tuple[bool, str]:
    """(ok, text) of a one-line reply: `+OK` / `+PONG` are ok, `-ERR ...` is not; anything else
    is reported as an unexpected reply."""
    text = line.decode(errors="replace").strip()
    if text.startswith("+"):
        return True, text[1:]
    if text.startswith("-"):
        return False, text[1:]
    return False, f"unexpected reply {text[:80]!r}" if text else "no reply"
