"""The response reader handing a 200's body to a caller's buffers (`BodySink`): the same bytes as
`body` would hold, however the socket cuts them, and the same strict framing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.connectors.engine.http_response import MalformedResponse
from tests.support.responses import feed


class BufferSink:
    """A sink that hands out `part`-byte windows of one buffer (a real one: the wire's contract)."""

    def __init__(self, part: int) -> None:
        self.part = part
        self.buffer = bytearray()
        self.filled = 0
        self.began: int | None = None

    def begin(self, length: int) -> None:
        self.began = length
        self.buffer = bytearray(length)

    def target(self) -> memoryview:
        return memoryview(self.buffer)[self.filled : self.filled + self.part]

    def wrote(self, count: int) -> None:
        self.filled += count

    def ended(self) -> None:
        return


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body


@given(st.binary(min_size=1, max_size=3000), st.integers(1, 700), st.integers(1, 900))
def test_a_body_read_into_a_sink_is_the_body_however_it_is_cut(
    body: bytes, part: int, recv_size: int
) -> None:
    sink = BufferSink(part)
    response = feed(_ok(body), sink, recv_size)
    assert (response.status, response.body, response.sunk_bytes) == (200, b"", len(body))
    assert (sink.began, bytes(sink.buffer)) == (len(body), body)


def test_an_answer_other_than_200_keeps_its_body_and_leaves_the_sink_alone() -> None:
    data = b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found"
    sink = BufferSink(64)
    response = feed(data, sink, 1000)
    assert (response.status, response.body, response.sunk_bytes) == (404, b"not found", 0)
    assert sink.began is None


@pytest.mark.parametrize(
    "data",
    [_ok(b"abcdef") + b"trailing", _ok(b"abcdef")[:-2]],
    ids=["longer than its length", "cut short"],
)
def test_a_body_that_does_not_match_its_length_is_malformed(data: bytes) -> None:
    with pytest.raises(MalformedResponse):
        feed(data, BufferSink(4), 5)
