"""Connection limits for `serve --transport http`: a header deadline and a per-user cap.

Loopback is shared by every local user, and the HTTP server would otherwise keep any number of
connections that never finish their request headers (slow-loris): they use up file descriptors
until authenticated clients are refused, and every refused accept used to log a traceback.

- A connection must deliver complete request headers within `HEADER_TIMEOUT_S` of opening (and
  of finishing the previous response, for the next request on a kept-alive connection), or it
  is closed.
- Each local user (the uid owning the client's socket, asked of the kernel by the connection's
  exact addresses (sock_diag netlink, as `ss` does), /proc/net/tcp only where that fails: on
  loopback every client has the same address, so the address tells no one apart) holds at most
  `PER_USER_CONNECTIONS` open connections; a connection over the cap is closed at once.
- What is refused or timed out costs one log line per `LOG_INTERVAL_S`, with counts.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0
PER_USER_CONNECTIONS = 64
LOG_INTERVAL_S = 10.0


class _Tally:
    """Connections per user and what was refused since the last log line."""

    def __init__(self) -> None:
        self.open: Counter[int | None] = Counter()
        self.refused: Counter[int | None] = Counter()
        self.timed_out = 0
        self.logged_at = 0.0

    def note(self) -> None:
        now = time.monotonic()
        if now - self.logged_at < LOG_INTERVAL_S:
            return
        self.logged_at = now
        if self.refused:
            users = ", ".join(f"uid {uid}: {n}" for uid, n in self.refused.items())
            log.warning(
                "refused connections over the cap of %d per user (%s) in the last %gs",
                PER_USER_CONNECTIONS,
                users,
                LOG_INTERVAL_S,
            )
        if self.timed_out:
            log.warning(
                "closed %d connections that sent no complete request headers within %gs",
                self.timed_out,
                HEADER_TIMEOUT_S,
            )
        self.refused.clear()
        self.timed_out = 0


TALLY = _Tally()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header deadline and the per-user cap."""

    _user: int | None = None
    _counted = False
    _header_timer: Any = None
    _waiting_cycle: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._user = socket_owner(
            transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        )
        if TALLY.open[self._user] >= PER_USER_CONNECTIONS:
            TALLY.refused[self._user] += 1
            TALLY.note()
            transport.close()
            return
        TALLY.open[self._user] += 1
        self._counted = True
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._counted:
            self._counted = False
            TALLY.open[self._user] -= 1
            if TALLY.open[self._user] <= 0:
                del TALLY.open[self._user]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_timer is not None and self.cycle is not self._waiting_cycle:
            self._cancel_header_timer()  # a new request's headers are complete

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # the next request on this connection gets a deadline too

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._waiting_cycle = self.cycle
        self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is self._waiting_cycle and not self.transport.is_closing():
            TALLY.timed_out += 1
            TALLY.note()
            self.transport.close()


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
