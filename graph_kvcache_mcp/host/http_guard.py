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
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar, TypeAlias

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)
SocketOwner: TypeAlias = Callable[[Any, Any], int | None]
"""(peer address, local address) -> the uid owning the client's socket, None when unknown."""

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


def _unknown_owner(_peer: Any, _local: Any) -> int | None:
    return None


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header deadline and the per-user cap."""

    _user: int | None = None
    owner_of: ClassVar[SocketOwner] = staticmethod(_unknown_owner)
    """Who owns a client's socket; `guarded_protocol` sets it (None counts every client as one
    unknown user)."""
    _counted = False
    _header_timer: Any = None
    _waiting_cycle: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._user = type(self).owner_of(
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


def guarded_protocol(socket_owner: SocketOwner) -> type[GuardedH11Protocol]:
    """The protocol class whose per-user cap counts connections by `socket_owner` (the uid
    owning a client's socket, from the kernel: `connectors/net/peer_user`, given by the
    composition root, as the runtime does no I/O of its own)."""
    owned = {"owner_of": staticmethod(socket_owner)}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), owned)
