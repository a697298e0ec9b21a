"""Where the connector's copies run, ordered against the model's own work by events.

On CUDA the model writes the KV cache on its compute stream, asynchronously: a copy out of a
block must start after the writes queued before it (an event recorded on the compute stream,
waited on by a side stream), and the forward pass must not read a loaded block before its copy
in is done (the compute stream waits on the load's event). `CudaStreams` does that with torch's
streams and events (imported lazily: only a CUDA worker needs them). On CPU every copy has
finished when it returns, so `ImmediateStreams` runs them in place. Tests check the order with a
recording double of `CopyStreams` (tests/support).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Fence(Protocol):
    """A point in a stream's work: done when everything queued before it has run."""

    def query(self) -> bool:
        """True once the work before the fence is done (never waits)."""
        ...

    def synchronize(self) -> None:
        """Block the calling thread until the work before the fence is done."""
        ...


class CopyStreams(Protocol):
    """The compute stream, a side stream for saves and a stream for loads."""

    def record_compute(self) -> Fence:
        """A fence after the work queued on the compute stream so far (the model's writes)."""
        ...

    def on_save_stream(self, after: Fence, copy: Callable[[], None]) -> Fence:
        """Queue `copy` on the save stream once `after` is done; the fence of its end."""
        ...

    def on_load_stream(self, after: Fence, copy: Callable[[], None]) -> Fence:
        """Queue `copy` on the load stream once `after` is done; the fence of its end."""
        ...

    def compute_waits(self, fence: Fence) -> None:
        """Work queued on the compute stream from now on starts after `fence`."""
        ...

    def synchronize_loads(self) -> None:
        """Block until every copy queued on the load stream is done."""
        ...


class DoneFence:
    """The fence of work that finished when it was queued (CPU copies)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return


DONE = DoneFence()


class ImmediateStreams:
    """CPU: no streams; a copy has finished when the call that makes it returns."""

    def record_compute(self) -> Fence:
        return DONE

    def on_save_stream(self, after: Fence, copy: Callable[[], None]) -> Fence:
        copy()
        return DONE

    def on_load_stream(self, after: Fence, copy: Callable[[], None]) -> Fence:
        copy()
        return DONE

    def compute_waits(self, fence: Fence) -> None:
        return

    def synchronize_loads(self) -> None:
        return


class CudaStreams:
    """CUDA streams of one device: saves on a low-priority side stream, loads on their own."""

    def __init__(self, device: Any) -> None:
        import torch  # a CUDA worker only

        self._cuda = torch.cuda
        self.device = device
        # Saves are background work: CUDA's lowest priority (0, the default; higher ones are
        # negative), never ahead of the model's kernels.
        self._save = torch.cuda.Stream(device=device, priority=0)
        self._load = torch.cuda.Stream(device=device)

    def record_compute(self) -> Fence:
        event = self._cuda.Event()
        event.record(self._cuda.current_stream(self.device))
        return event  # type: ignore[no-any-return]

    def on_save_stream(self, after: Fence, copy: Callable[[], None]) -> Fence:
        return self._on(self._save, after, copy)

    def on_load_stream(self, after: Fence, copy: Callable[[], None]) -> Fence:
        return self._on(self._load, after, copy)

    def compute_waits(self, fence: Fence) -> None:
        if not isinstance(fence, DoneFence):
            self._cuda.current_stream(self.device).wait_event(fence)

    def synchronize_loads(self) -> None:
        self._load.synchronize()

    def _on(self, stream: Any, after: Fence, copy: Callable[[], None]) -> Fence:
        if not isinstance(after, DoneFence):  # a CUDA event; DONE orders nothing
            stream.wait_event(after)
        with self._cuda.stream(stream):
            copy()  # tensors it allocates belong to this stream's pool: no cross-stream reuse
            done = self._cuda.Event()
            done.record(stream)
        return done  # type: ignore[no-any-return]


def streams_for(device: Any) -> CopyStreams:
    """The streams of the device that holds the KV cache."""
    return CudaStreams(device) if device.type == "cuda" else ImmediateStreams()
