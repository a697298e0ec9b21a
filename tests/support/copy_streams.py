"""`RecordingStreams`: a test double of the connector's `CopyStreams`, for machines without a GPU.

It stands in for CUDA streams and events, which cannot be staged on CPU. It records every event
record, wait and copy in order, and, like a GPU, runs a side stream's copies later than the call
that queued them: only when the host waits on a fence at or after them. Code that reads a copy's
result without waiting for its fence then reads memory the copy has not written yet, so the
ordering rules are checked by what the code reads, not only by the log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from graph_kvcache_mcp.plugins.vllm_kv.device.streams import Fence


@dataclass(eq=False)
class RecordedFence:
    streams: RecordingStreams
    name: str
    stream: str

    def query(self) -> bool:
        return self.streams.is_done(self)

    def synchronize(self) -> None:
        self.streams.note(f"host waits {self.name}")
        self.streams.run_until(self)


@dataclass
class _Stream:
    queued: list[tuple[Callable[[], None], RecordedFence]] = field(default_factory=list)
    done: set[str] = field(default_factory=set)


class RecordingStreams:
    """Records `record`, `wait` and `copy` calls; runs queued copies when waited for."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self._count = 0
        self._lock = threading.RLock()
        self._streams = {"save": _Stream(), "load": _Stream()}

    def note(self, entry: str) -> None:
        with self._lock:
            self.log.append(entry)

    def record_compute(self) -> RecordedFence:
        fence = self._fence("compute")
        self.note(f"record {fence.name} on compute")
        return fence

    def on_save_stream(self, after: Fence, copy: Callable[[], None]) -> RecordedFence:
        return self._queue("save", after, copy)

    def on_load_stream(self, after: Fence, copy: Callable[[], None]) -> RecordedFence:
        return self._queue("load", after, copy)

    def compute_waits(self, fence: Fence) -> None:
        self.note(f"compute waits {_name(fence)}")

    def synchronize_loads(self) -> None:
        self.note("host waits load stream")
        with self._lock:
            queued = list(self._streams["load"].queued)
        if queued:
            self.run_until(queued[-1][1])

    def is_done(self, fence: RecordedFence) -> bool:
        with self._lock:
            return fence.stream == "compute" or fence.name in self._streams[fence.stream].done

    def run_until(self, fence: RecordedFence) -> None:
        """Run the queued copies of `fence`'s stream up to it, in queue order."""
        if fence.stream == "compute":
            return
        with self._lock:
            stream = self._streams[fence.stream]
            while fence.name not in stream.done and stream.queued:
                copy, done = stream.queued.pop(0)
                self.log.append(f"copy on {fence.stream}")
                copy()
                stream.done.add(done.name)

    def _queue(self, name: str, after: Fence, copy: Callable[[], None]) -> RecordedFence:
        with self._lock:
            self.log.append(f"{name} stream waits {_name(after)}")
            fence = self._fence(name)
            self._streams[name].queued.append((copy, fence))
            self.log.append(f"record {fence.name} on {name}")
            return fence

    def _fence(self, stream: str) -> RecordedFence:
        with self._lock:
            self._count += 1
            return RecordedFence(self, f"e{self._count}", stream)


def _name(fence: Fence) -> str:
    """A recorded fence's name; "done" for one that was done when made (`streams.DONE`)."""
    return fence.name if isinstance(fence, RecordedFence) else "done"
