"""`BufferSink`: a value lands whole in the caller's buffer, through small reused bounce slots,
only while the call's `WriteWindow` is open; a value of another size never touches the buffer.
Driven through the real `ResponseReader`, playing the socket as the wire does."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.connectors.engine.buffer_sink import BufferSink, SlotPool, WriteWindow
from graph_kvcache_mcp.connectors.engine.http_response import MalformedResponse
from tests.support.responses import feed

FILL = 0xAA


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body


def _close_after(window: WriteWindow, pieces: int) -> Callable[[int], None]:
    """Closes the window once `pieces` body pieces went in, as a caller whose call ran out of
    time does while a lane is still receiving."""

    def after_piece(count: int) -> None:
        if count == pieces:
            window.close()

    return after_piece


def _sink(size: int, slot_bytes: int = 64, window: WriteWindow | None = None) -> BufferSink:
    buffer = memoryview(bytearray([FILL] * size))
    return BufferSink(buffer, window or WriteWindow(), SlotPool(slot_bytes))


@given(st.binary(min_size=1, max_size=2000), st.integers(1, 300), st.integers(1, 900))
def test_a_value_of_the_buffer_size_lands_whole_however_the_socket_cuts_it(
    body: bytes, slot_bytes: int, recv_size: int
) -> None:
    sink = _sink(len(body), slot_bytes)
    feed(_ok(body), sink, recv_size)
    assert sink.problem() is None
    assert bytes(sink.buffer) == body


@pytest.mark.parametrize("stored", [999, 1001])
def test_a_value_of_another_size_is_refused_and_never_touches_the_buffer(stored: int) -> None:
    sink = _sink(1000)
    feed(_ok(b"z" * stored), sink, 300)
    assert sink.problem() == f"stored value has {stored:,} bytes but the buffer 1,000"
    assert bytes(sink.buffer) == bytes([FILL]) * 1000


def test_nothing_is_written_once_the_window_has_closed() -> None:
    window = WriteWindow()
    sink = _sink(1000, window=window)
    feed(_ok(b"z" * 1000), sink, 100, after_piece=_close_after(window, 3))
    assert sink.problem() == "arrived after the call had ended"
    written = bytes(sink.buffer).count(b"z")
    assert 0 < written < 1000
    assert bytes(sink.buffer) == b"z" * written + bytes([FILL]) * (1000 - written)


def test_a_value_cut_short_is_reported_as_such() -> None:
    sink = _sink(1000)
    with pytest.raises(MalformedResponse):
        feed(_ok(b"z" * 1000)[:-400], sink, 100)
    assert sink.problem() == "value cut short (600 of 1,000 bytes)"


def test_a_sink_that_never_began_holds_nothing() -> None:
    assert _sink(10).problem() == "stored value has 0 bytes but the buffer 10"


def test_a_finished_value_returns_its_slot_for_the_next_one() -> None:
    slots = SlotPool(64)
    window = WriteWindow()
    first = BufferSink(memoryview(bytearray(100)), window, slots)
    feed(_ok(b"a" * 100), first, 50)
    second = BufferSink(memoryview(bytearray(100)), window, slots)
    feed(_ok(b"b" * 100), second, 50)
    assert first.problem() is second.problem() is None
    assert bytes(first.buffer) == b"a" * 100 and bytes(second.buffer) == b"b" * 100
    reused = slots.take()
    assert bytes(reused[:50]) == b"b" * 50, "the second value was received in the first's slot"


def test_closing_settles_the_copies_a_writer_queued_after_it_left_and_refuses_later_ones() -> None:
    """A device copy only queues work: `settle` waits for it, after the writers, before `close`
    returns (the CUDA load path passes its load stream's synchronize)."""
    events: list[str] = []
    window = WriteWindow(settle=lambda: events.append("settled"))
    assert window.enter()
    events.append("queued a copy")
    window.leave()
    window.close()
    events.append("closed")
    assert events == ["queued a copy", "settled", "closed"]
    assert not window.enter()


def test_a_pool_makes_its_slots_with_the_allocator_it_was_given() -> None:
    made: list[int] = []

    def allocate(size: int) -> memoryview:
        made.append(size)
        return memoryview(bytearray(size))

    pool = SlotPool(64, allocate=allocate)
    slot = pool.take()
    pool.give(slot)
    assert pool.take() is slot and made == [64]  # reused, not made again
