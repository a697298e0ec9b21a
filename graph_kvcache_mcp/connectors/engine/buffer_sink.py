"""Receiving engine values into a caller's own buffers (memory it may free after a call returns).

`BufferSink` is the wire's body sink (`http_response.BodySink`) for one value whose exact size
the caller knows: the socket fills a small reused bounce slot (`recv_into`, no allocation per
read) and each piece is copied on into the caller's buffer at once, so a value is copied twice in
pieces that stay in the CPU cache, never joined into one large `bytes` first. A value of any
other size is read into scratch space and refused, so the buffer is either filled whole or
reported as not filled.

Why not receive into the caller's buffer directly: a batch that runs out of time returns while
its lanes may still be inside `recv_into`, and the caller (LMCache) then frees or reuses that
memory. Here every copy into the buffer happens inside a `WriteWindow` the caller closes before
it answers: closing waits for copies under way and refuses later ones, so no byte lands in the
buffer after the call has returned. A lane's socket read only ever touches its bounce slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

RECEIVE_SLOT_BYTES = 256 * 1024
"""One bounce slot: what a single `recv_into` may take (a loopback read rarely returns more)."""


class WriteWindow:
    """Copies into a call's buffers may start only while the window is open.

    `settle` runs in `close` once the copies under way have returned: where a copy only queues
    work (a CUDA copy on a stream), it waits for that work, so nothing lands after `close`.
    """

    def __init__(self, settle: Callable[[], None] | None = None) -> None:
        self._changed = threading.Condition()
        self._open = True
        self._writers = 0
        self._settle = settle

    def enter(self) -> bool:
        with self._changed:
            if not self._open:
                return False
            self._writers += 1
            return True

    def leave(self) -> None:
        with self._changed:
            self._writers -= 1
            self._changed.notify_all()

    def close(self) -> None:
        """No copy starts after this; returns once the copies under way (each one bounce slot,
        microseconds) have finished."""
        with self._changed:
            self._open = False
            self._changed.wait_for(lambda: self._writers == 0)
        if self._settle is not None:
            self._settle()


class SlotPool:
    """Reused bounce slots, so that reads do not fault in fresh pages for every value. A slot
    goes back once its value is complete; a lane cut off mid-value keeps its slot.

    `allocate` makes a new slot of a given size (default: a `bytearray`); a CUDA KV cache's
    loads pass pinned host memory (`plugins.vllm_kv.device.slots`).
    """

    def __init__(
        self,
        slot_bytes: int = RECEIVE_SLOT_BYTES,
        *,
        allocate: Callable[[int], memoryview] | None = None,
    ) -> None:
        self.slot_bytes = slot_bytes
        self._allocate = allocate or _plain_slot
        self._free: list[memoryview] = []
        self._lock = threading.Lock()

    def take(self) -> memoryview:
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._allocate(self.slot_bytes)

    def give(self, slot: memoryview) -> None:
        with self._lock:
            self._free.append(slot)


def _plain_slot(size: int) -> memoryview:
    return memoryview(bytearray(size))


class BufferSink:
    """Receives one value into `buffer` (a writable byte view) if it has exactly its size."""

    def __init__(self, buffer: memoryview, window: WriteWindow, slots: SlotPool) -> None:
        self.buffer = buffer
        self._window = window
        self._slots = slots
        self._slot: memoryview | None = None
        self._length: int | None = None
        self._filled = 0
        self._refused: str | None = None

    # --- BodySink ----------------------------------------------------------------------------

    def begin(self, length: int) -> None:
        self._length = length
        if length != len(self.buffer):
            self._refused = f"stored value has {length:,} bytes but the buffer {len(self.buffer):,}"
        else:
            self._slot = self._slots.take()

    def target(self) -> memoryview:
        """The bounce slot (the reader trims it to what is left of the body); a refused value
        is read into it too, and dropped."""
        if self._slot is None:
            self._slot = self._slots.take()
        return self._slot

    def wrote(self, count: int) -> None:
        if self._refused is not None:
            return
        assert self._slot is not None
        if not self._window.enter():
            self._refused = "arrived after the call had ended"
            return
        try:
            self.buffer[self._filled : self._filled + count] = self._slot[:count]
        finally:
            self._window.leave()
        self._filled += count
        if self._filled == len(self.buffer):
            self._slots.give(self._slot)
            self._slot = None

    def ended(self) -> None:
        return  # every copy into the buffer is fenced by the window in `wrote`

    # --- result ------------------------------------------------------------------------------

    def problem(self) -> str | None:
        """None when the buffer holds the whole value; else why it does not."""
        if self._refused is not None:
            return self._refused
        if self._length is None and len(self.buffer):
            return f"stored value has 0 bytes but the buffer {len(self.buffer):,}"
        if self._filled != len(self.buffer):
            return f"value cut short ({self._filled:,} of {len(self.buffer):,} bytes)"
        return None
