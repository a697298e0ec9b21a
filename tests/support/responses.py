"""HTTP responses for the strict reader's property tests: an oracle of what frames a value beyond
doubt, a strategy of near-miss responses built from the pieces that break readers, and `feed`,
which plays the wire's read loop over bytes for tests of body sinks."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from graph_kvcache_mcp.connectors.engine.http_response import (
    BodySink,
    ResponseReader,
    WireResponse,
)


def feed(
    data: bytes,
    sink: BodySink,
    recv_size: int,
    *,
    after_piece: Callable[[int], None] | None = None,
) -> WireResponse:
    """Plays the wire over `data`: `recv` until the head is in, then `recv_into` the sink's
    targets, at most `recv_size` bytes a read; `after_piece(n)` runs after the n-th of those."""
    reader = ResponseReader(head_only=False, sink=sink)
    at = pieces = 0
    while not reader.closed:
        target = reader.target()
        if target is None:
            chunk = data[at : at + min(recv_size, reader.want())]
            at += len(chunk)
            reader.received(chunk)
            continue
        chunk = data[at : at + min(recv_size, len(target))]
        target[: len(chunk)] = chunk
        at += len(chunk)
        reader.received_into(len(chunk))
        pieces += 1
        if after_piece is not None:
            after_piece(pieces)
    return reader.response()


def frames_beyond_doubt(data: bytes, body: bytes) -> bool:
    """The test's own oracle: `data` is heads ending in a 200 whose only framing is one agreed
    ASCII content-length equal to the body's size, and no transfer-encoding."""
    if not data.endswith(b"\r\n\r\n" + body):
        return False
    heads = data[: len(data) - len(body) - 4].split(b"\r\n\r\n")
    lines = heads[-1].split(b"\r\n")
    if not lines[0].startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        return False
    fields = [line.partition(b":") for line in lines[1:]]
    names = [name.lower() for name, _, _ in fields]
    lengths = {
        value.strip(b" \t") for name, _, value in fields if name.lower() == b"content-length"
    }
    return b"transfer-encoding" not in names and {int(v) for v in lengths} == {len(body)}


_NAMES = st.sampled_from(
    [b"content-length"] * 4 + [b"Content-Length", b"transfer-encoding", b"content-type", b"x y"]
)
_VALUES = st.sampled_from(
    [b"5"] * 6 + [b"6"] * 3 + [b"05", b"chunked", "\u0665".encode(), b"", b"5, 5", b"-1", b"\x00"]
)
_FINAL_STATUS = st.sampled_from(
    [b"HTTP/1.1 200 OK"] * 12
    + [b"HTTP/1.0 200", b"HTTP/2 200", b"HTTP/1.1 20 OK", b"HTTP/1.1 101 S"]
)
_INFORMATIONAL = st.sampled_from([b"HTTP/1.1 100 Continue", b"HTTP/1.1 103 Early Hints"])


def _head(status_line: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"\r\n".join([status_line, *(name + b": " + value for name, value in headers)]) + (
        b"\r\n\r\n"
    )


@st.composite
def near_responses(draw: st.DrawFn) -> bytes:
    """Responses built from the pieces that break readers: repeated and conflicting lengths,
    non-ASCII digits, transfer codings, 1xx heads, wrong versions, bodies of the wrong size."""
    headers = st.lists(st.tuples(_NAMES, _VALUES), max_size=3)
    informational: list[tuple[bytes, list[tuple[bytes, bytes]]]] = draw(
        st.lists(st.tuples(_INFORMATIONAL, st.just([])), max_size=2)
    )
    final = (draw(_FINAL_STATUS), draw(headers))
    body = draw(st.sampled_from([b"", b"hello", b"hello", b"hello!", b"5\r\nhello\r\n0\r\n\r\n"]))
    return b"".join(_head(*parts) for parts in [*informational, final]) + body
