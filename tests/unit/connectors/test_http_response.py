"""The strict response reader: any bytes give a response or a `MalformedResponse`, and a 200 with a
value only when the bytes frame it beyond doubt."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph_kvcache_mcp.connectors.engine.http_response import (
    MAX_INFORMATIONAL,
    MalformedResponse,
    ResponseReader,
    WireResponse,
    read_response,
)
from tests.support.responses import frames_beyond_doubt, near_responses


def _read_in_chunks(data: bytes, cuts: list[int], *, head_only: bool = False) -> WireResponse:
    reader = ResponseReader(head_only=head_only)
    start = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}):
        if cut > start:
            reader.received(data[start:cut])
            start = cut
    if start < len(data):
        reader.received(data[start:])
    reader.received(b"")
    return reader.response()


@settings(max_examples=400)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=400), max_size=5))
def test_any_bytes_give_a_response_or_a_malformed_response(data: bytes, cuts: list[int]) -> None:
    try:
        response = _read_in_chunks(data, cuts)
    except MalformedResponse:
        return
    if response.status == 200:
        assert frames_beyond_doubt(data, response.body)


@settings(max_examples=1000)
@given(near_responses(), st.lists(st.integers(min_value=0, max_value=200), max_size=4))
def test_near_miss_responses_give_a_value_only_when_framed_beyond_doubt(
    data: bytes, cuts: list[int]
) -> None:
    try:
        response = _read_in_chunks(data, cuts)
    except MalformedResponse:
        return
    if response.status == 200:
        assert frames_beyond_doubt(data, response.body), data


@given(
    st.binary(max_size=2000),
    st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 200", b"HTTP/1.1 200 "]),
    st.sampled_from([b"Content-Length", b"content-length", b"CONTENT-LENGTH"]),
    st.lists(st.integers(min_value=0, max_value=2200), max_size=5),
)
def test_a_well_formed_response_reads_as_exactly_its_body(
    body: bytes, status_line: bytes, length_name: bytes, cuts: list[int]
) -> None:
    data = (
        status_line + b"\r\ncontent-type: application/octet-stream\r\n"
        + length_name + b": %d\r\nconnection: close\r\n\r\n" % len(body) + body
    )  # fmt: skip
    assert _read_in_chunks(data, cuts) == WireResponse(200, body, "application/octet-stream")


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            "Transfer",
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!", "conflicting"),
        ("HTTP/1.1 200 OK\r\ncontent-length: ١٢\r\n\r\nhello".encode(), "ASCII number"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello", "ASCII number"),
        (b"HTTP/1.1 200 OK\r\n\r\nhello", "without content-length"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "switched protocols"),
        (b"HTTP/1.1 200 OK\r\n folded: line\r\ncontent-length: 0\r\n\r\n", "name: value"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999\r\n\r\n", "cap"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nhello", "longer than"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nhello", "cut short"),
        (b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_INFORMATIONAL + 1), "informational"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "closed before the response head"),
    ],
)
def test_a_response_that_cannot_be_framed_is_refused_with_a_reason(
    data: bytes, complaint: str
) -> None:
    with pytest.raises(MalformedResponse, match=complaint):
        read_response(data)


def test_informational_responses_are_skipped_before_the_real_one() -> None:
    data = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
    )
    assert read_response(data) == WireResponse(200, b"hello", "")


def test_repeated_content_lengths_that_agree_are_one_length() -> None:
    data = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nContent-Length: 05\r\n\r\nhello"
    assert read_response(data).body == b"hello"


def test_an_answer_to_head_has_no_body_even_when_the_peer_sends_one() -> None:
    head = b"HTTP/1.1 503 Busy\r\ncontent-length: 9\r\n\r\n"
    assert read_response(head, head_only=True) == WireResponse(503, b"", "")
    assert read_response(head + b"try later", head_only=True) == WireResponse(503, b"", "")
