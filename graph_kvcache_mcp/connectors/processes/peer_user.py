"""Which user holds the other end of a loopback TCP connection: the kernel's socket tables.

A connection from 127.0.0.1 says nothing about who made it; the kernel's table of TCP sockets
(`/proc/net/tcp`, `/proc/net/tcp6`, one line per socket, readable by every user) names the uid
that owns each one. The client's socket is the line whose local address is the connection's
client address and whose remote address is the server's; it exists as long as the request is in
flight. Linux only: elsewhere the owner is unknown (None), which callers treat as "not ours".
"""

from __future__ import annotations

import socket
from pathlib import Path

_TABLES = {socket.AF_INET: Path("/proc/net/tcp"), socket.AF_INET6: Path("/proc/net/tcp6")}


def peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client end of the TCP connection `client` -> `server` (both as a
    server sees them), or None when no such socket is listed (or the table is unreadable)."""
    family = socket.AF_INET6 if ":" in client[0] else socket.AF_INET
    try:
        local, remote = _entry(family, *client), _entry(family, *server)
    except OSError:  # not an address (a unix socket's "client")
        return None
    try:
        table = _TABLES[family].read_text(encoding="ascii").splitlines()[1:]
    except OSError:
        return None
    for line in table:
        fields = line.split()
        if len(fields) > 7 and fields[1] == local and fields[2] == remote:
            return int(fields[7])
    return None


def _entry(family: int, host: str, port: int) -> str:
    """`host:port` as the table writes it: the address in 32-bit words of host byte order
    (little-endian on every machine we run on), the port in hex."""
    packed = socket.inet_pton(family, host)
    words = "".join(
        f"{int.from_bytes(packed[i : i + 4], 'little'):08X}" for i in range(0, len(packed), 4)
    )
    return f"{words}:{port:04X}"
