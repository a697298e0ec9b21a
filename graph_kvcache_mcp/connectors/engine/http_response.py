"""Reading one HTTP/1.1 response from the engine, strictly. No I/O: the wire feeds it bytes.

The engine answers with a status line, `content-type`, `content-length` and `connection: close`,
and nothing else. Anything this reader cannot frame beyond doubt is refused with
`MalformedResponse` rather than guessed at, so framing bytes never end up inside a value:

- `Transfer-Encoding` of any kind is refused (the engine never sends it; a proxy that re-encodes
  the body sits in between, and the fix is to reach the engine directly);
- every response that may carry a body needs one `Content-Length` of ASCII digits; repeats must
  agree exactly, and a length over the engine's value cap is refused before reading it;
- informational (1xx) responses are skipped, as HTTP/1.1 asks of a client (the engine sends none;
  we never send `Expect`), except `101 Switching Protocols`, which is refused;
- the status line must be `HTTP/1.0` or `HTTP/1.1` with a three-digit status, each header line a
  token, a colon and visible characters (no folded lines, no bare line feeds, no NULs);
- a body longer or shorter than its length is refused; bytes after the answer to a HEAD are read
  and dropped (a HEAD yields no value, and its status is still the peer's answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from graph_kvcache_mcp.domain.engine.limits import VALUE_CAP_BYTES

MAX_HEAD_BYTES = 64 * 1024
"""A response head larger than this is refused (the engine's are under 200 bytes)."""

MAX_INFORMATIONAL = 8
"""How many 1xx responses may precede the real one."""

_RECV_CHUNK = 256 * 1024
_HEAD_RECV_FOR_SINK = 4096
"""What a reader with a sink asks for until the head is in: the head fits (a few hundred bytes)
and the body then goes straight into the sink by `recv_into`. Asking for `_RECV_CHUNK` brought up
to 256 KiB of body in the head's chunk, which was copied twice more on its way to the sink."""

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: [\t\x20-\x7e\x80-\xff]*)?")
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[\t ]*([\t\x20-\x7e\x80-\xff]*)")
_DIGITS = re.compile(rb"[0-9]{1,19}")
_NO_BODY_STATUSES = frozenset({204, 304})


class MalformedResponse(Exception):
    """The bytes received are not a response this client can frame beyond doubt."""


@dataclass(frozen=True, slots=True)
class WireResponse:
    status: int
    body: bytes
    content_type: str
    sunk_bytes: int = 0
    """Body bytes handed to the caller's `BodySink` instead of `body` (a 200 read into it)."""


class BodySink(Protocol):
    """Where the body of a 200 answer goes when the caller reads it into its own buffers.

    The wire receives straight into `target()` (`socket.recv_into`), so the body is copied once,
    from the kernel into the caller's memory. `target()` must return a non-empty writable view
    until `begin`'s length is reached; a sink that does not want the rest (a value of the wrong
    size) hands out scratch space and remembers why.
    """

    def begin(self, length: int) -> None:
        """The body's content-length, before any of it arrives."""

    def target(self) -> memoryview:
        """Where the next body bytes go."""

    def wrote(self, count: int) -> None:
        """`count` bytes were put at the start of the last `target()`."""

    def ended(self) -> None:
        """The exchange is over, the body complete or not (a timeout, a reset): no `target()`
        or `wrote()` follows, and no receive into the last target is under way."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    length: int | None
    content_type: str


class ResponseReader:
    """Builds one response from received chunks; shared by the blocking and async paths.

    Feed it each `recv()` result (b"" at the peer's close) until `closed`, then take `response()`.
    Two measured choices (256 KiB GETs, this machine): read on to the engine's own close even after
    the last body byte, since closing first ran 3x slower (1.9k vs 5.8k GET/s); and keep the chunks
    `recv()` returns and join them once, since receiving into fresh zero-filled buffers cost
    ~150 us a request in page faults.
    """

    def __init__(
        self,
        *,
        head_only: bool,
        max_body_bytes: int = VALUE_CAP_BYTES,
        sink: BodySink | None = None,
    ) -> None:
        self.head_only = head_only
        self.max_body_bytes = max_body_bytes
        self.closed = False
        self._sink = sink
        self._sinking = False
        self._chunks: list[bytes] = []
        self._head: ResponseHead | None = None
        self._body_bytes = 0
        self._informational = 0

    def want(self) -> int:
        """How many bytes to ask the socket for next (the rest of the body, plus one for EOF)."""
        if self._head is None and self._sink is not None and not self.head_only:
            return _HEAD_RECV_FOR_SINK
        if self._head is None or self._head.length is None or self.head_only:
            return _RECV_CHUNK
        return max(4096, self._head.length - self._body_bytes + 1)

    def target(self) -> memoryview | None:
        """Where to `recv_into` next, while a sink takes the body; None: `recv(want())` instead."""
        if not self._sinking or self._head is None or self._body_bytes >= (self._head.length or 0):
            return None
        assert self._sink is not None
        view = self._sink.target()
        left = (self._head.length or 0) - self._body_bytes
        return view if len(view) <= left else view[:left]

    def received_into(self, count: int) -> None:
        """`recv_into(target())` put `count` bytes there; 0 means the peer closed."""
        if not count:
            self._on_close()
            return
        assert self._sink is not None
        self._sink.wrote(count)
        self._body_bytes += count

    def received(self, chunk: bytes) -> None:
        """Take the next bytes from the socket; b"" means the peer closed.

        Raises:
            MalformedResponse: the bytes so far cannot be a response this reader accepts.
        """
        if not chunk:
            self._on_close()
        elif self._head is None:
            self._on_head_bytes(chunk)
        else:
            self._on_body_bytes(chunk)

    def response(self) -> WireResponse:
        """The response, once `closed`."""
        assert self._head is not None and self.closed  # closed without error: a head was parsed
        if self.head_only or not self._chunks:
            body = b""
        else:
            body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        sunk = self._body_bytes if self._sinking else 0
        return WireResponse(self._head.status, body, self._head.content_type, sunk)

    def _on_head_bytes(self, chunk: bytes) -> None:
        pending = b"".join((*self._chunks, chunk)) if self._chunks else chunk
        while True:
            end = pending.find(b"\r\n\r\n")
            if end < 0:
                if len(pending) > MAX_HEAD_BYTES:
                    raise MalformedResponse("response head too large")
                self._chunks = [pending] if pending else []
                return
            head = parse_head(pending[:end], head_only=self.head_only)
            pending = pending[end + 4 :]
            if head is not None:
                break
            self._informational += 1
            if self._informational > MAX_INFORMATIONAL:
                raise MalformedResponse("too many informational (1xx) responses")
        if head.length is not None and head.length > self.max_body_bytes:
            raise MalformedResponse(
                f"content-length {head.length:,} is over the {self.max_body_bytes:,}-byte cap"
            )
        self._head = head
        self._chunks = []
        self._body_bytes = 0
        if self._sink is not None and head.status == 200 and head.length and not self.head_only:
            self._sinking = True
            self._sink.begin(head.length)
        if pending:
            self._on_body_bytes(pending)

    def _on_body_bytes(self, chunk: bytes) -> None:
        assert self._head is not None
        if self.head_only:
            return  # never kept: the answer to a HEAD has no value to frame
        if self._sinking:
            self._sink_bytes(chunk)
            return
        self._chunks.append(chunk)
        self._body_bytes += len(chunk)
        if self._head.length is not None and self._body_bytes > self._head.length:
            raise MalformedResponse("response longer than its content-length")

    def _sink_bytes(self, chunk: bytes) -> None:
        """Copy body bytes that came with the head (or past the body's end) into the sink."""
        assert self._sink is not None and self._head is not None and self._head.length is not None
        view = memoryview(chunk)
        while view:
            if self._body_bytes >= self._head.length:
                raise MalformedResponse("response longer than its content-length")
            target = self.target()
            assert target is not None
            count = min(len(target), len(view))
            target[:count] = view[:count]
            self.received_into(count)
            view = view[count:]

    def _on_close(self) -> None:
        self.closed = True
        if self._head is None:
            raise MalformedResponse("connection closed before the response head")
        length = self._head.length
        if length is not None and not self.head_only and self._body_bytes < length:
            raise MalformedResponse(f"response cut short ({self._body_bytes} of {length} bytes)")


def parse_head(head: bytes, *, head_only: bool) -> ResponseHead | None:
    """The status and framing of one response head (without its final blank line); None for an
    informational (1xx) response, which the reader skips.

    Raises:
        MalformedResponse: says which rule the head breaks.
    """
    status_line, *header_lines = head.split(b"\r\n")
    status_match = _STATUS_LINE.fullmatch(status_line)
    if status_match is None:
        raise MalformedResponse("not an HTTP/1.x response")
    status = int(status_match[1])
    if status == 101:
        raise MalformedResponse("the peer switched protocols (101)")
    lengths: set[bytes] = set()
    content_type: bytes | None = None
    for line in header_lines:
        header = _HEADER_LINE.fullmatch(line)
        if header is None:
            raise MalformedResponse("a header line that is not `name: value`")
        name, value = header[1].lower(), header[2].rstrip(b"\t ")
        if name == b"transfer-encoding":
            raise MalformedResponse(
                "the response uses Transfer-Encoding, which the engine never sends: something "
                "between us re-encodes it; point the client at the engine itself"
            )
        if name == b"content-length":
            if _DIGITS.fullmatch(value) is None:
                raise MalformedResponse("content-length is not a plain ASCII number")
            lengths.add(value.lstrip(b"0") or b"0")
        elif name == b"content-type" and content_type is None:
            content_type = value
    if status < 200:
        return None
    if len(lengths) > 1:
        raise MalformedResponse("conflicting content-length headers")
    length = int(lengths.pop()) if lengths else None
    if length is None and not head_only and status not in _NO_BODY_STATUSES:
        raise MalformedResponse("response without content-length")
    return ResponseHead(status, length, (content_type or b"").decode("latin-1"))


def read_response(data: bytes, *, head_only: bool = False) -> WireResponse:
    """A whole response from all the bytes a connection carried (for tests and one-shot reads).

    Raises:
        MalformedResponse: as `ResponseReader.received` does.
    """
    reader = ResponseReader(head_only=head_only)
    if data:
        reader.received(data)
    reader.received(b"")
    return reader.response()
