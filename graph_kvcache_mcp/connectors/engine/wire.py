"""One HTTP/1.1 exchange with the engine over a plain socket: blocking (`exchange`, for threads)
or on the asyncio event loop (`exchange_async`, non-blocking sockets, no thread hop).

Why not httpx or http.client: the engine closes every connection after one response, so a request
is connect + one write + read-to-close. Measured on these machines with 256 KiB blocks, httpx's
async client is 2-4x slower than the stdlib; a thread hop per request (anyio.to_thread) halves
throughput (1.5k vs 3.1k GET/s); anyio's TCP streams reach 1.8k; asyncio's `loop.sock_*` calls
reach 5.9k. So the async path uses `loop.sock_*` for http:// and a worker thread only for TLS or
a non-asyncio event loop. See tools/bench_kv.py for the figures.

Every exchange runs against a `Deadline` its caller made for the whole call: connect, write and
read share it, so a hung engine costs a call its budget and no more. Responses are framed by
`http_response.ResponseReader`, strictly. Never sends `Expect: 100-continue` or chunked bodies (the
engine rejects both). Raises `WireError` subclasses; the token never appears in any message.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.to_thread
import sniffio
from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine.http_response import (
    BodySink,
    MalformedResponse,
    ResponseReader,
    WireResponse,
)
from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls, explain_certificate_failure
from graph_kvcache_mcp.domain.endpoints import HttpEndpoint

_SEND_IN_ONE_BELOW = 1024 * 1024

Stage = Literal["queue", "connect", "write", "read"]
_STAGE_WORDS: dict[Stage, str] = {
    "queue": "waiting for a free connection",
    "connect": "connecting",
    "write": "sending the request",
    "read": "waiting for the answer",
}


class WireError(Exception):
    """The exchange failed before a complete response arrived."""


class WireUnsent(WireError):
    """The connection failed before any byte of the request went out: safe to send again."""


class WireRefused(WireUnsent):
    """Nothing listens at the address."""


class WireTimeout(WireError):
    """The call's deadline passed; `stage` says where the exchange was."""

    def __init__(self, stage: Stage, budget_s: float) -> None:
        self.stage = stage
        self.budget_s = budget_s
        super().__init__(f"deadline passed while {_STAGE_WORDS[stage]}")


class WireBroken(WireError):
    """The connection failed or the response was cut short or malformed."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """The instant a whole client call (every request of it, retries included) must end by."""

    budget_s: float
    expires_at: float

    @classmethod
    def after(cls, budget_s: float) -> Deadline:
        return cls(budget_s, time.monotonic() + budget_s)

    def remaining_s(self) -> float:
        return self.expires_at - time.monotonic()

    def socket_timeout_s(self) -> float:
        """What is left, for a socket timeout.

        Raises:
            TimeoutError: nothing is left (a zero socket timeout would mean non-blocking).
        """
        left = self.remaining_s()
        if left <= 0:
            raise TimeoutError
        return left


class EngineWire:
    """Sends single requests to one engine. Thread-safe: it holds no connection state."""

    def __init__(
        self,
        endpoint: HttpEndpoint,
        token: SecretStr | None,
        *,
        still_held: Callable[[], bool] | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        """`tls`: a fleet's mutual-TLS context for an https engine on another host (default:
        the system's CAs, no client certificate)."""
        self.endpoint = endpoint
        self._still_held = still_held
        """Asked after each connection is made, before a byte goes out: False when the process
        proved to hold the port has gone (`children.proof`), and the port may be someone else's."""
        self._auth = (
            f"Authorization: Bearer {token.get_secret_value()}\r\n".encode("latin-1")
            if token is not None
            else b""
        )
        host = endpoint.host if ":" not in endpoint.host else f"[{endpoint.host}]"
        self._literal_family = _literal_family(endpoint.host)
        self._host_header = f"Host: {host}:{endpoint.port}\r\n".encode("ascii")
        context = ssl.create_default_context() if tls is None else tls.context
        self._tls = context if endpoint.scheme == "https" else None
        self._trusted = None if tls is None else tls.trusted

    def __repr__(self) -> str:  # the token must never show up in a repr
        return f"EngineWire({self.endpoint.url!r})"

    def exchange(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        deadline: Deadline,
        headers: bytes = b"",
        sink: BodySink | None = None,
    ) -> WireResponse:
        """Send `method path` (path already validated, sent verbatim) and return the response.

        With a `sink`, the body of a 200 answer is received straight into the sink's buffers
        (`sunk_bytes` says how much) instead of into `body`.

        Raises:
            WireError: the request did not complete by `deadline`; the subclass says how.
        """
        size = 0 if body is None else len(body)
        head = self._head(method, path, body, headers)
        self._check_holder()  # a known-dead holder: not even a connection to its old port
        sock = self._connect(deadline)
        stage: Stage = "write"
        try:
            self._check_holder()
            sock.settimeout(deadline.socket_timeout_s())
            if body is None:
                sock.sendall(head)
            elif size < _SEND_IN_ONE_BELOW:
                sock.sendall(head + body)
            else:
                sock.sendall(head)
                sock.settimeout(deadline.socket_timeout_s())
                sock.sendall(body)
            stage = "read"
            reader = ResponseReader(head_only=method == "HEAD", sink=sink)
            while not reader.closed:
                sock.settimeout(deadline.socket_timeout_s())
                if (target := reader.target()) is None:
                    reader.received(sock.recv(reader.want()))
                else:
                    reader.received_into(sock.recv_into(target))
            return reader.response()
        except TimeoutError as exc:
            raise WireTimeout(stage, deadline.budget_s) from exc
        except MalformedResponse as exc:
            raise WireBroken(f"malformed response: {exc}") from exc
        except OSError as exc:
            raise WireBroken(
                f"connection failed while {_STAGE_WORDS[stage]} ({type(exc).__name__})"
            ) from exc
        finally:
            sock.close()
            if sink is not None:
                sink.ended()

    async def exchange_async(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        deadline: Deadline,
        headers: bytes = b"",
    ) -> WireResponse:
        """`exchange` for async callers: on the event loop's own sockets when it can.

        Raises:
            WireError: the request did not complete by `deadline`; the subclass says how.
        """
        if self._tls is not None or sniffio.current_async_library() != "asyncio":
            # The blocking exchange keeps to the deadline itself; the thread is never abandoned.
            return await anyio.to_thread.run_sync(
                lambda: self.exchange(method, path, body, deadline=deadline, headers=headers)
            )
        loop = asyncio.get_running_loop()
        size = 0 if body is None else len(body)
        head = self._head(method, path, body, headers)
        self._check_holder()
        sock = socket.socket(socket.AF_INET6 if ":" in self.endpoint.host else socket.AF_INET)
        sock.setblocking(False)
        stage: Stage = "connect"
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # One cancel scope for the whole exchange (cheaper than one per stage); `stage` says
            # which part ran out of time.
            with anyio.fail_after(deadline.remaining_s()):
                try:
                    await loop.sock_connect(sock, (self.endpoint.host, self.endpoint.port))
                except ConnectionRefusedError as exc:
                    raise WireRefused("connection refused") from exc
                except (ConnectionResetError, ConnectionAbortedError) as exc:
                    raise WireUnsent(f"connection reset while connecting ({exc.strerror})") from exc
                self._check_holder()
                stage = "write"
                if body is None:
                    await loop.sock_sendall(sock, head)
                elif size < _SEND_IN_ONE_BELOW:
                    await loop.sock_sendall(sock, head + body)
                else:
                    await loop.sock_sendall(sock, head)
                    await loop.sock_sendall(sock, body)
                stage = "read"
                reader = ResponseReader(head_only=method == "HEAD")
                while not reader.closed:
                    reader.received(await loop.sock_recv(sock, reader.want()))
            return reader.response()
        except TimeoutError as exc:
            raise WireTimeout(stage, deadline.budget_s) from exc
        except WireError:
            raise
        except MalformedResponse as exc:
            raise WireBroken(f"malformed response: {exc}") from exc
        except OSError as exc:
            raise WireBroken(
                f"connection failed while {_STAGE_WORDS[stage]} ({type(exc).__name__})"
            ) from exc
        finally:
            sock.close()

    def _check_holder(self) -> None:
        if self._still_held is not None and not self._still_held():
            raise WireUnsent("the engine proved to hold this port has exited; nothing was sent")

    def _head(self, method: str, path: str, body: bytes | None, headers: bytes) -> bytes:
        target = (self.endpoint.base_path + path).encode("ascii")
        size = 0 if body is None else len(body)
        return b"".join(
            (
                method.encode("ascii"),
                b" ",
                target,
                b" HTTP/1.1\r\n",
                self._host_header,
                self._auth,
                b"Content-Length: %d\r\n" % size if body is not None else b"",
                headers,
                b"Connection: close\r\n\r\n",
            )
        )

    def _open(self, address: tuple[str, int], timeout_s: float) -> socket.socket:
        """A connected socket. An address literal (the usual engine) is connected directly:
        `create_connection` asks getaddrinfo on every request, which a restored request's load
        (one GET per block) paid about 4% of its Python time for."""
        if self._literal_family is None:
            return socket.create_connection(address, timeout=timeout_s)
        sock = socket.socket(self._literal_family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return sock

    def _connect(self, deadline: Deadline) -> socket.socket:
        address = (self.endpoint.host, self.endpoint.port)
        try:
            sock = self._open(address, deadline.socket_timeout_s())
        except ConnectionRefusedError as exc:
            raise WireRefused("connection refused") from exc
        except (ConnectionResetError, ConnectionAbortedError) as exc:
            raise WireUnsent(f"connection reset while connecting ({exc.strerror})") from exc
        except TimeoutError as exc:
            raise WireTimeout("connect", deadline.budget_s) from exc
        except OSError as exc:
            raise WireBroken(f"cannot connect ({type(exc).__name__}: {exc.strerror})") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is None:
            return sock
        try:
            sock.settimeout(deadline.socket_timeout_s())
            return self._tls.wrap_socket(sock, server_hostname=self.endpoint.host)
        except TimeoutError as exc:
            sock.close()
            raise WireTimeout("connect", deadline.budget_s) from exc
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise WireBroken(explain_certificate_failure(exc, trusted=self._trusted)) from exc
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            raise WireBroken(f"TLS handshake failed ({type(exc).__name__})") from exc


def _literal_family(host: str) -> socket.AddressFamily | None:
    """The address family of an IP address literal; None for a name to resolve."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET
