"""One HTTP/1.1 exchange with the engine over a plain socket: blocking (`exchange`, for threads)
or on the asyncio event loop (`exchange_async`, non-blocking sockets, no thread hop).

Why not httpx or http.client: the engine closes every connection after one response, so a request
is connect + one write + read-to-close. Measured on these machines with 256 KiB blocks, httpx's
async client is 2-4x slower than the stdlib; a thread hop per request (anyio.to_thread) halves
throughput (1.5k vs 3.1k GET/s); anyio's TCP streams reach 1.8k; asyncio's `loop.sock_*` calls
reach 5.9k. So the async path uses `loop.sock_*` for http:// and a worker thread only for TLS or
a non-asyncio event loop. See tools/bench_kv.py for the figures.

Every exchange runs against a `Deadline` its caller made for the whole call: connect, write and
read share it, so a hung engine costs a call its budget and no more. Never sends
`Expect: 100-continue` or chunked bodies (the engine rejects both). Raises `WireError`
subclasses; the token never appears in any message.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.to_thread
import sniffio
from pydantic import SecretStr

from graph_kvcache_mcp.domain.endpoints import HttpEndpoint

_MAX_HEAD_BYTES = 64 * 1024
_RECV_CHUNK = 256 * 1024
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


@dataclass(frozen=True, slots=True)
class WireResponse:
    status: int
    body: bytes
    content_type: str


class EngineWire:
    """Sends single requests to one engine. Thread-safe: it holds no connection state."""

    def __init__(self, endpoint: HttpEndpoint, token: SecretStr | None) -> None:
        self.endpoint = endpoint
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
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        deadline: Deadline,
        headers: bytes = b"",
    ) -> WireResponse:
        """Send `method path` (path already validated, sent verbatim) and return the response.

        Raises:
            WireError: the request did not complete by `deadline`; the subclass says how.
        """
        size = 0 if body is None else len(body)
        head = self._head(method, path, body, headers)
        sock = self._connect(deadline)
        stage: Stage = "write"
        try:
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
            assembler = _Assembler(head_only=method == "HEAD")
            while not assembler.closed:
                sock.settimeout(deadline.socket_timeout_s())
                assembler.received(sock.recv(assembler.want()))
            return assembler.response()
        except TimeoutError as exc:
            raise WireTimeout(stage, deadline.budget_s) from exc
        except OSError as exc:
            raise WireBroken(
                f"connection failed while {_STAGE_WORDS[stage]} ({type(exc).__name__})"
            ) from exc
        finally:
            sock.close()

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
                stage = "write"
                if body is None:
                    await loop.sock_sendall(sock, head)
                elif size < _SEND_IN_ONE_BELOW:
                    await loop.sock_sendall(sock, head + body)
                else:
                    await loop.sock_sendall(sock, head)
                    await loop.sock_sendall(sock, body)
                stage = "read"
                assembler = _Assembler(head_only=method == "HEAD")
                while not assembler.closed:
                    assembler.received(await loop.sock_recv(sock, assembler.want()))
            return assembler.response()
        except TimeoutError as exc:
            raise WireTimeout(stage, deadline.budget_s) from exc
        except WireError:
            raise
        except OSError as exc:
            raise WireBroken(
                f"connection failed while {_STAGE_WORDS[stage]} ({type(exc).__name__})"
            ) from exc
        finally:
            sock.close()

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

    def _connect(self, deadline: Deadline) -> socket.socket:
        address = (self.endpoint.host, self.endpoint.port)
        try:
            sock = socket.create_connection(address, timeout=deadline.socket_timeout_s())
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
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            raise WireBroken(f"TLS handshake failed ({type(exc).__name__})") from exc


class _Assembler:
    """Builds a response from received chunks; shared by the blocking and async paths.

    Feed it each `recv()` result until `closed`. Two measured choices (256 KiB GETs, this machine):
    read on to the engine's own close even after the last body byte, since closing first ran 3x
    slower (1.9k vs 5.8k GET/s); and keep the chunks `recv()` returns and join them once, since
    receiving into fresh zero-filled buffers cost ~150 us a request in page faults.
    """

    def __init__(self, *, head_only: bool) -> None:
        self.head_only = head_only
        self.closed = False
        self._chunks: list[bytes] = []
        self._parsed: tuple[int, int | None, str] | None = None
        self._body_bytes = 0

    def want(self) -> int:
        """How many bytes to ask the socket for next (the rest of the body, plus one for EOF)."""
        if self._parsed is None or self._parsed[1] is None:
            return _RECV_CHUNK
        return max(4096, self._parsed[1] - self._body_bytes + 1)

    def received(self, chunk: bytes) -> None:
        if not chunk:
            self._on_close()
            return
        if self._parsed is not None:
            self._chunks.append(chunk)
            self._body_bytes += len(chunk)
        else:
            self._on_head_bytes(chunk)
        length = None if self._parsed is None else self._parsed[1]
        if length is not None and not self.head_only and self._body_bytes > length:
            raise WireBroken("response longer than its content-length")

    def _on_head_bytes(self, chunk: bytes) -> None:
        pending = b"".join((*self._chunks, chunk)) if self._chunks else chunk
        end = pending.find(b"\r\n\r\n")
        if end < 0:
            if len(pending) > _MAX_HEAD_BYTES:
                raise WireBroken("response head too large")
            self._chunks = [pending]
            return
        self._parsed = _parse_head(pending[:end])
        body = pending[end + 4 :]
        self._chunks = [body] if body else []
        self._body_bytes = len(body)

    def _on_close(self) -> None:
        self.closed = True
        if self._parsed is None:
            raise WireBroken("connection closed before the response head")
        length = self._parsed[1]
        if length is not None and not self.head_only and self._body_bytes < length:
            raise WireBroken(f"response cut short ({self._body_bytes} of {length} bytes)")

    def response(self) -> WireResponse:
        assert self._parsed is not None  # closed without error implies a parsed head
        status, _, content_type = self._parsed
        if self.head_only or not self._chunks:
            body = b""
        else:
            body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        return WireResponse(status, body, content_type)


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
