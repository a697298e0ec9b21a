"""The connector's saves: a queue of blocks uploaded to the engine in the background.

The forward pass only queues copies of newly full blocks (`UploadQueue.save_later`); an upload
thread sends them on a few niced lanes, on the cores vLLM reserved where it did, so that uploads
never crowd out a forward step. Blocks beyond `MAX_PENDING_SAVE_BYTES`, or queued while the engine
is down, are dropped: a future miss, never back-pressure. A graceful stop drains the queue
(bounded, logged). Imports only the standard library and the package's wire client.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.domain.outcomes import Stored, Unavailable
from graph_kvcache_mcp.plugins.vllm_kv.engine_calls import OutagePause, TransferTally, logger

UPLOAD_NICENESS = 10
MAX_PENDING_SAVE_BYTES = 512 * 1024 * 1024
"""Blocks waiting for upload beyond this are dropped (a future miss, never back-pressure)."""
UPLOAD_LANES = 2
"""Uploads in flight at once: a few, so that an upload burst never crowds out a forward step."""
MAX_UPLOAD_DEFER_S = 10.0
"""An upload waits for vLLM's forward step to end at most this long before it goes anyway."""

Payload = bytes | memoryview
"""A queued block's data: bytes, or a view of host memory a device copy fills (`device.mover`)."""
Encode = Callable[[str, Payload], bytes]
"""Turns a queued block's data into the value stored under its key."""

DRAIN_ENV = "EPISTEMIC_GRAPH_KVCACHE_DRAIN_S"
DEFAULT_DRAIN_S = 10.0
"""How long a stopping vLLM's worker waits for its queued saves (`give_workers_time_to_drain`
makes vLLM wait for the worker that long)."""
WORKER_SHUTDOWN_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"


def drain_seconds(environ: Mapping[str, str]) -> float:
    """The stop's wait for saves from `EPISTEMIC_GRAPH_KVCACHE_DRAIN_S` (seconds, >= 0)."""
    try:
        value = float(environ.get(DRAIN_ENV, DEFAULT_DRAIN_S))
    except ValueError:
        logger.warning("%s is not a number of seconds; using %g", DRAIN_ENV, DEFAULT_DRAIN_S)
        return DEFAULT_DRAIN_S
    return max(0.0, value)


def give_workers_time_to_drain(environ: MutableMapping[str, str], drain_s: float) -> None:
    """Let vLLM's executor wait for a worker that drains its saves.

    Called in vLLM's EngineCore process (the scheduler side of the connector), before vLLM
    freezes its environment settings: its executor SIGKILLs workers still running
    `VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS` (5) + 4 s into a shutdown. A value the user set is
    kept, and said when it is shorter than the drain.
    """
    wanted = int(drain_s) + 5
    given = environ.get(WORKER_SHUTDOWN_ENV)
    if given is None:
        environ[WORKER_SHUTDOWN_ENV] = str(wanted)
    elif not given.isdigit() or int(given) < wanted:
        logger.warning(
            "EngineKVConnector: %s=%s may stop a worker before its saves (up to %g s) are in",
            WORKER_SHUTDOWN_ENV,
            given,
            drain_s,
        )


class UploadQueue:
    """Blocks queued for upload to one engine, sent by a background thread."""

    def __init__(self, client: SyncKvClient, pause: OutagePause, tally: TransferTally) -> None:
        self.client = client
        self._pause = pause
        self.tally = tally
        # Uploads are background work and must not take CPU from vLLM's forward pass on a
        # small box, so their threads run niced.
        self._upload_cores: frozenset[int] = frozenset()
        self._upload_pool = ThreadPoolExecutor(
            UPLOAD_LANES, thread_name_prefix="engine-kv-up", initializer=self._enter_background
        )
        self._between_steps = threading.Event()
        self._between_steps.set()
        self._lock = threading.Lock()
        self._saves: queue.Queue[tuple[list[tuple[str, Payload]], Encode | None] | None]
        self._saves = queue.Queue()
        self._pending_bytes = 0
        self._pending_blocks = 0
        self._idle = threading.Event()
        self._idle.set()
        self._uploader = threading.Thread(target=self._upload_loop, name="engine-kv-upload")
        self._uploader.daemon = True
        self._uploader.start()

    def save_later(
        self, items: Sequence[tuple[str, Payload]], encode: Encode | None = None
    ) -> None:
        """Queue (key, value) pairs for upload; drops them when the engine is down or far behind.

        With `encode`, each value is `encode(key, data)` of the data queued, made on the upload
        thread: work that need not delay the forward pass that queued it (checksum, header).
        """
        size = sum(len(value) for _, value in items)
        with self._lock:
            if self._pause.quiet() or self._pending_bytes + size > MAX_PENDING_SAVE_BYTES:
                logger.debug("engine KV: dropped %d blocks (engine down or behind)", len(items))
                self.tally.add(dropped_blocks=len(items))
                return
            self._pending_bytes += size
            self._pending_blocks += len(items)
            self._idle.clear()
        self._saves.put((list(items), encode))

    def run_uploads_on(self, cores: frozenset[int]) -> None:
        """Run the upload threads on `cores` only (vLLM's reserved cores; nothing when empty).

        vLLM's CPU worker binds its OpenMP threads to their cores, and every thread the worker
        starts later inherits that binding: our niced upload threads then ran on the forward
        pass's own core, beside it, rather than on the cores vLLM keeps free for its other work.
        """
        self._upload_cores = cores
        if cores and (thread := self._uploader.native_id) is not None:
            bind_thread(thread, cores)  # the upload lanes bind themselves as they start

    def step_started(self) -> None:
        """vLLM's forward step began: new uploads without cores of their own wait for it to end
        (`MAX_UPLOAD_DEFER_S`)."""
        self._between_steps.clear()

    def step_ended(self) -> None:
        self._between_steps.set()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued block was sent (or dropped); False when time ran out."""
        return self._idle.wait(timeout_s)

    def pending(self) -> tuple[int, int]:
        """Blocks and bytes queued or being uploaded, not yet answered by the engine."""
        with self._lock:
            return self._pending_blocks, self._pending_bytes

    def drain(self, timeout_s: float) -> None:
        """Wait, at most `timeout_s` and saying so in the log, for the queued saves to reach the
        engine: a graceful stop must not drop blocks a restarted vLLM would load."""
        blocks, size = self.pending()
        if not blocks:
            logger.info("EngineKVConnector: stopping; every save is in the engine")
            return
        logger.info(
            "EngineKVConnector: stopping; waiting up to %g s for %d blocks (%d bytes) of saves "
            "to reach the engine",
            timeout_s,
            blocks,
            size,
        )
        began = time.monotonic()
        if self.flush(timeout_s):
            counts = self.tally.peek()
            logger.info(
                "EngineKVConnector: the saves were answered in %.2f s (%d blocks dropped since "
                "the last stats, engine down or behind)",
                time.monotonic() - began,
                counts.get("dropped_blocks", 0),
            )
            return
        blocks, size = self.pending()
        logger.warning(
            "EngineKVConnector: gave up after %g s with %d blocks (%d bytes) not saved; a "
            "restarted vLLM recomputes them (raise %s to wait longer)",
            timeout_s,
            blocks,
            size,
            DRAIN_ENV,
        )

    def close(self, flush_timeout_s: float) -> None:
        self.flush(flush_timeout_s)
        self._saves.put(None)
        self._upload_pool.shutdown(wait=False, cancel_futures=True)

    # --- internals ---------------------------------------------------------------------------

    def _enter_background(self) -> None:
        """Run the calling thread niced, on the upload cores where they are set."""
        _lower_thread_priority()
        if self._upload_cores:
            bind_calling_thread(self._upload_cores)

    def _upload_loop(self) -> None:
        _lower_thread_priority()
        while (queued := self._saves.get()) is not None:
            items, encode = queued
            try:
                self._upload(items, encode)
            except Exception:  # the thread must survive anything; a lost save is a future miss
                logger.exception("engine KV: upload failed")
            finally:
                with self._lock:
                    self._pending_bytes -= sum(len(value) for _, value in items)
                    self._pending_blocks -= len(items)
                    if self._saves.empty():
                        self._idle.set()

    def _upload(self, items: list[tuple[str, Payload]], encode: Encode | None = None) -> None:
        if self._pause.quiet():
            self.tally.add(dropped_blocks=len(items))
            return
        deadline = time.monotonic() + max(self._pause.timeout_s, 15.0)
        outcomes = self._pause.run_all(
            self._upload_pool,
            lambda item: self._put_between_steps(item, encode),
            items,
            deadline,
            "save",
        )
        # Stored but not new: another instance saved the same block first (first writer wins).
        new = [len(value) for (_, value), o in zip(items, outcomes, strict=True) if _new(o)]
        acked = sum(isinstance(o, Stored) for o in outcomes)
        self.tally.add(
            saved_blocks=len(new), saved_bytes=sum(new), dropped_blocks=len(items) - acked
        )
        logger.debug("engine KV: saved %d new of %d blocks", len(new), len(items))

    def _put_between_steps(
        self, item: tuple[str, Payload], encode: Encode | None
    ) -> Stored | Unavailable:
        """Encode and PUT one block; on the forward pass's own cores, between vLLM's steps.

        vLLM's CPU worker runs its forward pass on OpenMP threads bound to their cores; a thread
        of ours running beside them stalls each of their barriers. On cores of their own
        (`run_uploads_on`) uploads go at once: held back to the gaps between steps, a long
        chunked prefill let through about two blocks a step, and its saves fell behind.
        """
        if not self._upload_cores:
            self._between_steps.wait(MAX_UPLOAD_DEFER_S)
        key, data = item
        return self.client.put(key, encode(key, data) if encode else bytes(data))


def _new(outcome: object) -> bool:
    return isinstance(outcome, Stored) and outcome.stored_new


def _lower_thread_priority() -> None:
    """Nice the calling thread only (Linux applies setpriority to a thread id)."""
    # Off Linux, or not permitted, uploads simply run at normal priority.
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), UPLOAD_NICENESS)


def bind_thread(thread_id: int, cores: frozenset[int]) -> None:
    """Let one thread (a Linux thread id) run on `cores` only."""
    # Off Linux, or where the cores are gone, the thread keeps its binding: only slower.
    with contextlib.suppress(OSError, AttributeError, ValueError):
        os.sched_setaffinity(thread_id, cores)


def bind_calling_thread(cores: frozenset[int]) -> None:
    """Let the calling thread run on `cores` only (a thread pool's initializer)."""
    bind_thread(threading.get_native_id(), cores)


def process_cores() -> frozenset[int]:
    """Every core this worker process may use: its parent's (vLLM's EngineCore starts its
    workers unbound), whatever binding vLLM gave the calling thread. Empty off Linux."""
    try:
        return frozenset(os.sched_getaffinity(os.getppid()))
    except (OSError, AttributeError):
        return frozenset()


def reserved_cores() -> frozenset[int]:
    """The cores this process may use that the calling thread may not: called from vLLM's CPU
    worker's main thread after vLLM bound it to its OpenMP cores, the cores vLLM reserved for
    its other processes (`VLLM_CPU_NUM_OF_RESERVED_CPU`). Empty when OpenMP has every core, or
    off Linux.

    The process's own cores are its parent's (vLLM's EngineCore starts its workers unbound);
    the worker's mask is its OpenMP binding.
    """
    try:
        bound = os.sched_getaffinity(0)
    except (OSError, AttributeError):
        return frozenset()
    return process_cores() - bound
