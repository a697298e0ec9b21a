"""Which user holds the other end of a loopback TCP connection.

A connection from 127.0.0.1 says nothing about who made it; the kernel knows the uid owning the
client's socket. Used by the HTTP server's per-user connection cap (`host/http_guard.py`) and by
the owner-only filters in front of LMCache's HTTP apps and a dev-mode vLLM
(`plugins/owner_only.py`). Linux only: elsewhere the owner is unknown (None), which callers treat
as "not ours".
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

_SOCK_DIAG = 4  # NETLINK_SOCK_DIAG
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_DIAG_UID_OFFSET = 16 + 4 + 48 + 12  # nlmsghdr, then inet_diag_msg up to idiag_uid


def socket_owner(peer: Any, local: Any = None) -> int | None:
    """The uid owning the TCP socket at `peer` ((host, port) of a loopback client connected to
    `local`); None when it cannot be told.

    The kernel is asked for that one socket by its four addresses (sock_diag), an exact lookup
    that a burst of connections cannot disturb. /proc/net/tcp is the fallback: the kernel
    writes it a page per read and resumes by position, so while connections come and go a read
    can skip a row, and under a burst (the very slow-loris the cap is for) every retry could
    miss it, leaving the connection counted for no one and one more of the attacker's let in.
    """
    if not isinstance(peer, tuple) or len(peer) < 2:
        return None
    host, port = peer[0], int(peer[1])
    try:
        packed = socket.inet_pton(socket.AF_INET, host)
    except OSError:
        return None
    if isinstance(local, tuple) and len(local) >= 2:
        try:
            server = socket.inet_pton(socket.AF_INET, local[0])
            request = (
                struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
                + struct.pack("!HH", port, int(local[1]))
                + packed
                + bytes(12)
                + server
                + bytes(12)
                + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
            )
            header = struct.pack(
                "=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0
            )
            with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _SOCK_DIAG) as diag:
                diag.settimeout(1.0)
                diag.sendto(header + request, (0, 0))
                answer = diag.recv(65536)
            if struct.unpack_from("=H", answer, 4)[0] == _SOCK_DIAG_BY_FAMILY:
                return int(struct.unpack_from("=I", answer, _DIAG_UID_OFFSET)[0])
        except (OSError, struct.error):
            pass  # no netlink here (or the socket just closed): read the table instead
    wanted = f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"
    # The kernel writes the table in pages, so a read while connections come and go can skip
    # a row: look again before giving up.
    for _ in range(3):
        try:
            rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
        except OSError:
            return None
        for row in rows:
            cols = row.split()
            if len(cols) > 7 and cols[1] == wanted:
                return int(cols[7])
    return None
