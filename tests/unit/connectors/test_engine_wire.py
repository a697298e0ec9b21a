"""The socket-level client against doubles for faults a real engine will not produce."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.domain.outcomes import Hit, Miss, Unavailable
from tests.support.peers import Script, garbage_peer, hung_peer, scripted_peer, slow_peer
from tests.support.processes import wait_until
from tests.support.responses import frames_beyond_doubt, near_responses


def test_a_peer_that_answers_garbage_reads_as_unavailable() -> None:
    with garbage_peer() as url, SyncKvClient(url, None, timeout_s=1.0) as client:
        outcome = client.get("k")
    assert isinstance(outcome, Unavailable)
    assert "not an HTTP/1.x response" in outcome.reason


def test_a_response_cut_short_is_unavailable_not_a_short_value() -> None:
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\nonly-some"
    with garbage_peer(reply) as url, SyncKvClient(url, None, timeout_s=1.0) as client:
        outcome = client.get("k")
    assert isinstance(outcome, Unavailable)
    assert "cut short" in outcome.reason


def test_a_silent_peer_times_out_within_the_read_timeout() -> None:
    with slow_peer(hold_s=3.0) as url, SyncKvClient(url, None, timeout_s=0.3) as client:
        started = time.monotonic()
        outcome = client.put("k", b"v")  # not retried: PUT is not idempotent here
        elapsed = time.monotonic() - started
    assert isinstance(outcome, Unavailable)
    assert "timed out" in outcome.reason
    assert elapsed < 2.0


def test_unexpected_status_is_explained_with_the_engine_message() -> None:
    body = b'{"error":"StoreError","message":"failed to store block"}'
    reply = (
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )
    with garbage_peer(reply) as url, SyncKvClient(url, None, timeout_s=1.0) as client:
        outcome = client.put("k", b"v")
    assert isinstance(outcome, Unavailable)
    assert outcome.status == 500
    assert "failed to store block" in outcome.reason


def test_a_timed_out_request_is_never_sent_again() -> None:
    with (
        hung_peer() as (url, accepted),
        SyncKvClient(url, None, timeout_s=0.5, concurrency=8) as client,
    ):
        one = client.get("k")
        batch = client.contains_many([f"k{i}" for i in range(9)])
        # one for the single key, one per lane for the batch (its 9th key found the deadline gone)
        wait_until(lambda: accepted.value >= 1 + 8, timeout_s=5, what="the calls' connections")
        assert accepted.value == 1 + 8
    for outcome in (one, *batch):
        assert isinstance(outcome, Unavailable) and "timed out after 0.5 s" in outcome.reason
    assert client.counters().retries == 0


async def test_the_async_client_never_resends_after_a_timeout_either() -> None:
    with hung_peer() as (url, accepted):
        client = KvClient.connect(url, None, timeout_s=0.5, concurrency=8)
        one = await client.get("k")
        batch = await client.get_many([f"k{i}" for i in range(9)])
        # one for the single key, one per lane for the batch (its 9th key found the deadline gone)
        wait_until(lambda: accepted.value >= 1 + 8, timeout_s=5, what="the calls' connections")
        assert accepted.value == 1 + 8
    for outcome in (one, *batch):
        assert isinstance(outcome, Unavailable) and "timed out after 0.5 s" in outcome.reason
    assert client.counters().retries == 0


_OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"


@pytest.mark.parametrize(
    ("reply", "complaint"),
    [
        (_OK + b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "Transfer-Encoding"),
        (_OK + b"content-length: 5\r\ncontent-length: 15\r\n\r\nhello", "conflicting"),
        (_OK + "content-length: \u0661\u0662\r\n\r\nhello world!".encode(), "ASCII number"),
        (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n", "switched protocols"),
    ],
)
def test_a_response_the_engine_never_sends_is_unavailable_with_a_reason(
    reply: bytes, complaint: str
) -> None:
    """Chunked framing, conflicting lengths, non-ASCII digits (which str.isdigit accepts) and a
    protocol switch: never a value with framing bytes in it, never an exception."""
    with scripted_peer(reply) as (url, _), SyncKvClient(url, None, timeout_s=1.0) as client:
        outcome = client.get("k")
    assert isinstance(outcome, Unavailable) and complaint in outcome.reason, outcome


async def test_a_100_continue_before_the_answer_is_skipped_by_both_clients() -> None:
    reply = b"HTTP/1.1 100 Continue\r\n\r\n" + _OK + b"content-length: 5\r\n\r\nhello"
    with scripted_peer(reply) as (url, _):
        with SyncKvClient(url, None, timeout_s=1.0) as client:
            assert client.get("k") == Hit(b"hello")
        assert await KvClient.connect(url, None, timeout_s=1.0).get("k") == Hit(b"hello")


@pytest.fixture(scope="module")
def script() -> Iterator[tuple[str, Script]]:
    with scripted_peer() as peer:
        yield peer


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(st.binary(max_size=200), near_responses()))
def test_any_reply_reads_as_a_typed_outcome_and_a_hit_only_when_well_framed(
    script: tuple[str, Script], reply: bytes
) -> None:
    url, peer = script
    peer.reply = reply
    with SyncKvClient(url, None, timeout_s=1.0) as client:
        outcome = client.get("k")
    assert isinstance(outcome, Hit | Miss | Unavailable)
    if isinstance(outcome, Hit):
        assert frames_beyond_doubt(reply, outcome.value)
