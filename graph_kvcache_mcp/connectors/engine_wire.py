"""One HTTP/1.1 exchange with the engine over a plain socket (sync; callers run it in threads).

Why not httpx or http.client: the engine closes every connection after one response, so a request
is connect + one write + read-to-close. Measured on these machines, httpx's async client moves
256 KiB blocks 2-4x slower than the stdlib, and http.client spends much of a small request parsing
headers with the email package. This module writes the request head and body in one send and reads
the fixed, tiny response head the engine produces (content-type, content-length, connection) —
see tools/bench_kv.py for the figures.

Never sends `Expect: 100-continue` or chunked bodies (the engine rejects both). Raises `WireError`
subclasses; the token never appears in any message.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

from pydantic import SecretStr

from graph_kvcache_mcp.domain.endpoints import HttpEndpoint

ENGINE_REQUEST_DEADLINE_S = 15.0
"""The engine answers 400 to a request not fully received within 15 s."""

MIN_UPLOAD_RATE_BYTES_S = 8 * 1024 * 1024
"""Slowest upload we tolerate when sizing write timeouts (64 MiB then needs 8 s)."""

_MAX_HEAD_BYTES = 64 * 1024
_RECV_CHUNK = 256 * 1024
_SEND_IN_ONE_BELOW = 1024 * 1024


class WireError(Exception):
    """The exchange failed before a complete response arrived."""


class WireTimeout(WireError):
    """Connect, write or read took longer than allowed."""


class WireRefused(WireError):
    """Nothing listens at the address."""


class WireBroken(WireError):
    """The connection failed or the response was cut short or malformed."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Split timeouts: connect, read (waiting for the answer), and write (sized to the body)."""

    connect_s: float
    read_s: float

    def write_s(self, body_bytes: int) -> float:
        return min(
            ENGINE_REQUEST_DEADLINE_S,
            max(self.read_s, body_bytes / MIN_UPLOAD_RATE_BYTES_S + 1.0),
        )

    @classmethod
    def from_total(cls, timeout_s: float) -> Timeouts:
        return cls(connect_s=min(timeout_s, 3.0), read_s=timeout_s)


@dataclass(frozen=True, slots=True)
class WireResponse:
    status: int
    body: bytes
    content_type: str


class EngineWire:
    """Sends single requests to one engine. Thread-safe: it holds no connection state."""

    def __init__(self, endpoint: HttpEndpoint, token: SecretStr | None, timeouts: Timeouts) -> None:
        self.endpoint = endpoint
        self.timeouts = timeouts
        self._auth = (
            f"Authorization: Bearer {token.get_secret_value()}\r\n".encode("latin-1")
            if token is not None
            else b""
        )
        host = endpoint.host if ":" not in endpoint.host else f"[{endpoint.host}]"
        self._host_header = f"Host: {host}:{endpoint.port}\r\n".encode("ascii")
        self._tls = ssl.create_default_context() if endpoint.scheme == "https" else None

    def __repr__(self) -> str:  # the token must never show up in a repr
        return f"EngineWire({self.endpoint.url!r})"

    def exchange(
        self, method: str, path: str, body: bytes | None = None, *, headers: bytes = b""
    ) -> WireResponse:
        """Send `method path` (path already validated, sent verbatim) and return the response.

        Raises:
            WireError: the request did not complete; the subclass says how.
        """
        target = (self.endpoint.base_path + path).encode("ascii")
        size = 0 if body is None else len(body)
        head = b"".join(
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
        sock = self._connect()
        try:
            sock.settimeout(self.timeouts.write_s(size))
            if body is None:
                sock.sendall(head)
            elif size < _SEND_IN_ONE_BELOW:
                sock.sendall(head + body)
            else:
                sock.sendall(head)
                sock.sendall(body)
            sock.settimeout(self.timeouts.read_s)
            return _read_response(sock, head_only=method == "HEAD")
        except TimeoutError as exc:
            raise WireTimeout(f"no complete answer within {self.timeouts.read_s:g} s") from exc
        except OSError as exc:
            raise WireBroken(f"connection failed ({type(exc).__name__})") from exc
        finally:
            sock.close()

    def _connect(self) -> socket.socket:
        address = (self.endpoint.host, self.endpoint.port)
        try:
            sock = socket.create_connection(address, timeout=self.timeouts.connect_s)
        except ConnectionRefusedError as exc:
            raise WireRefused("connection refused") from exc
        except TimeoutError as exc:
            raise WireTimeout(f"connect took over {self.timeouts.connect_s:g} s") from exc
        except OSError as exc:
            raise WireBroken(f"cannot connect ({type(exc).__name__}: {exc.strerror})") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is None:
            return sock
        try:
            return self._tls.wrap_socket(sock, server_hostname=self.endpoint.host)
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            raise WireBroken(f"TLS handshake failed ({type(exc).__name__})") from exc


def _read_response(sock: socket.socket, *, head_only: bool) -> WireResponse:
    buffer = bytearray()
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        chunk = sock.recv(_RECV_CHUNK)
        if not chunk:
            raise WireBroken("connection closed before the response head")
        buffer += chunk
        if len(buffer) > _MAX_HEAD_BYTES:
            raise WireBroken("response head too large")
    status, length, content_type = _parse_head(bytes(buffer[:end]))
    if head_only:
        return WireResponse(status, b"", content_type)
    body = bytearray(buffer[end + 4 :])
    if length is None:  # no length: the body runs to the close
        while chunk := sock.recv(_RECV_CHUNK):
            body += chunk
        return WireResponse(status, bytes(body), content_type)
    while len(body) < length:
        chunk = sock.recv(max(_RECV_CHUNK, length - len(body)))
        if not chunk:
            raise WireBroken(f"response cut short ({len(body)} of {length} bytes)")
        body += chunk
    if len(body) > length:
        raise WireBroken("response longer than its content-length")
    return WireResponse(status, bytes(body), content_type)


def _parse_head(head: bytes) -> tuple[int, int | None, str]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise WireBroken("not an HTTP response")
    length: int | None = None
    content_type = ""
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            if not value.strip().isdigit():
                raise WireBroken("bad content-length")
            length = int(value)
        elif name == "content-type":
            content_type = value.strip()
    return int(parts[1]), length, content_type
