"""The engine as seen from inside vLLM: bounded, never-raising block lookups, reads and writes.

Used by the vLLM KV connector (`vllm_kv_connector`), which runs in vLLM's processes: every call
here answers within the KV timeout (`EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S`, whole batch included) and
turns "engine down, slow or garbled" into a miss, so vLLM recomputes instead of failing. After a
failure the store stays quiet for `QUIET_AFTER_FAILURE_S` (answers "miss" at once) rather than
making every request wait for a dead engine.

Imports only the standard library and the package's wire client, which vLLM's own venv provides.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.children.proof import engine_proof
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.http_response import BodySink
from graph_kvcache_mcp.domain.endpoints import DEFAULT_KV_HOST, DEFAULT_KV_PORT
from graph_kvcache_mcp.domain.outcomes import Hit, Outcome, Presence, Stored, Unavailable

# Under "vllm." so that vLLM's own logging configuration prints it beside vLLM's lines.
LOGGER_NAME = "vllm.graph_kvcache.engine_kv"
QUIET_AFTER_FAILURE_S = 10.0
LOOKUP_CHUNK = 16
"""Existence checks per round: a cold prompt costs one round, not one per block."""
UPLOAD_NICENESS = 10
MAX_PENDING_SAVE_BYTES = 512 * 1024 * 1024
"""Blocks waiting for upload beyond this are dropped (a future miss, never back-pressure)."""
UPLOAD_LANES = 2
"""Uploads in flight at once: a few, so that an upload burst never crowds out a forward step."""
MAX_UPLOAD_DEFER_S = 10.0
"""An upload waits for vLLM's forward step to end at most this long before it goes anyway."""

logger = logging.getLogger(LOGGER_NAME)
_T = TypeVar("_T")
Encode = Callable[[str, bytes], bytes]
"""Turns a queued block's data into the value stored under its key."""
_R = TypeVar("_R")


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


class TransferTally:
    """Transfer counts (names from `domain.vllm.connector_counters`) added by the forward pass
    and the upload thread, taken once per vLLM step for its connector stats
    (`plugins.vllm_kv.stats`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, amount in counts.items():
                if amount:
                    self._counts[name] = self._counts.get(name, 0) + amount

    def peek(self) -> dict[str, int]:
        """Everything counted since the last take, left for it."""
        with self._lock:
            return dict(self._counts)

    def take(self) -> dict[str, int]:
        """Everything counted since the last take (empty when nothing was)."""
        with self._lock:
            taken, self._counts = self._counts, {}
        return taken


class EngineBlockStore:
    """Block reads and writes against one engine, bounded in time and never raising."""

    def __init__(
        self,
        client: SyncKvClient,
        *,
        timeout_s: float,
        concurrency: int,
        tally: TransferTally | None = None,
    ) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="engine-kv")
        # Lookups and loads sit on a request's critical path; uploads are background work and
        # must not take CPU from vLLM's forward pass on a small box, so their threads run niced.
        self._upload_cores: frozenset[int] = frozenset()
        self._upload_pool = ThreadPoolExecutor(
            UPLOAD_LANES, thread_name_prefix="engine-kv-up", initializer=self._enter_background
        )
        self._between_steps = threading.Event()
        self._between_steps.set()
        self._quiet_until = 0.0
        self.tally = tally or TransferTally()
        self._lock = threading.Lock()
        self._saves: queue.Queue[tuple[list[tuple[str, bytes]], Encode | None] | None]
        self._saves = queue.Queue()
        self._pending_bytes = 0
        self._pending_blocks = 0
        self._idle = threading.Event()
        self._idle.set()
        self._uploader = threading.Thread(target=self._upload_loop, name="engine-kv-upload")
        self._uploader.daemon = True
        self._uploader.start()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> EngineBlockStore:
        """The engine named by `EPISTEMIC_GRAPH_KVCACHE_URL` (or `_ADDR`), else 127.0.0.1:9130.

        Raises:
            ConfigError: a malformed URL, token or timeout in the environment.
        """
        settings = Settings.from_env(environ)
        url = settings.kv_url or f"http://{DEFAULT_KV_HOST}:{DEFAULT_KV_PORT}"
        client = SyncKvClient(
            url, settings.kv_token, timeout_s=settings.kv_timeout_s, proof=engine_proof(environ)
        )
        return cls(client, timeout_s=settings.kv_timeout_s, concurrency=settings.kv_concurrency)

    def __repr__(self) -> str:
        return f"EngineBlockStore({self.client.base_url!r})"

    # --- reads -------------------------------------------------------------------------------

    def count_present(self, keys: Sequence[str]) -> int:
        """How many of `keys`, from the first, the engine holds (0 when it cannot answer)."""
        deadline = time.monotonic() + self.timeout_s
        found = 0
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            answers = self._run_all(self.client.contains, chunk, deadline, "lookup")
            for answer in answers:
                if not (isinstance(answer, Presence) and answer.present):
                    return found
                found += 1
        return found

    def first_present(self, keys: Sequence[str]) -> int | None:
        """The index of the first of `keys` the engine holds (None when none, or no answer)."""
        deadline = time.monotonic() + self.timeout_s
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            answers = self._run_all(self.client.contains, chunk, deadline, "lookup")
            for offset, answer in enumerate(answers):
                if answer is None or isinstance(answer, Unavailable):
                    return None
                if isinstance(answer, Presence) and answer.present:
                    return start + offset
        return None

    def fetch(self, keys: Sequence[str]) -> list[bytes | None]:
        """The stored values of `keys`, None for each one missing or not read in time."""
        answers = self._run_all(self.client.get, keys, time.monotonic() + self.timeout_s, "load")
        return [answer.value if isinstance(answer, Hit) else None for answer in answers]

    def fetch_into(self, keys: Sequence[str], sinks: Sequence[BodySink]) -> list[Outcome[int]]:
        """Each key's value received straight into its sink, on up to `concurrency` lanes, the
        whole batch within the KV timeout; `Hit(bytes received)` where the engine had it.

        After an answer that is `Unavailable` (a timeout among them), a lane may still be
        writing into its sink's buffer for a moment: hand that buffer out again only after a
        batch without one.
        """
        if not keys or self._quiet():
            return [Unavailable("engine calls paused after a failure")] * len(keys)
        try:
            answers = self.client.get_many_into(keys, sinks)
        except Exception as exc:  # never into vLLM; InvalidKey cannot happen for our keys
            self._went_wrong("load", f"the client raised {type(exc).__name__}")
            return [Unavailable("the client raised")] * len(keys)
        if failure := next((a for a in answers if isinstance(a, Unavailable)), None):
            self._went_wrong("load", failure.reason)
        return answers

    # --- writes ------------------------------------------------------------------------------

    def save_later(self, items: list[tuple[str, bytes]], encode: Encode | None = None) -> None:
        """Queue (key, value) pairs for upload; drops them when the engine is down or far behind.

        With `encode`, each value is `encode(key, data)` of the data queued, made on the upload
        thread: work that need not delay the forward pass that queued it (checksum, header).
        """
        size = sum(len(value) for _, value in items)
        with self._lock:
            if self._quiet() or self._pending_bytes + size > MAX_PENDING_SAVE_BYTES:
                logger.debug("engine KV: dropped %d blocks (engine down or behind)", len(items))
                self.tally.add(dropped_blocks=len(items))
                return
            self._pending_bytes += size
            self._pending_blocks += len(items)
            self._idle.clear()
        self._saves.put((items, encode))

    def run_uploads_on(self, cores: frozenset[int]) -> None:
        """Run the upload threads on `cores` only (vLLM's reserved cores; nothing when empty).

        vLLM's CPU worker binds its OpenMP threads to their cores, and every thread the worker
        starts later inherits that binding: our niced upload threads then ran on the forward
        pass's own core, beside it, rather than on the cores vLLM keeps free for its other work.
        """
        self._upload_cores = cores
        if cores and (thread := self._uploader.native_id) is not None:
            _bind_thread(thread, cores)  # the upload lanes bind themselves as they start

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

    def close(self, *, flush_timeout_s: float = 5.0) -> None:
        self.flush(flush_timeout_s)
        self._saves.put(None)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._upload_pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    # --- internals ---------------------------------------------------------------------------

    def _quiet(self) -> bool:
        return time.monotonic() < self._quiet_until

    def _went_wrong(self, what: str, reason: str) -> None:
        with self._lock:
            first = not self._quiet()
            self._quiet_until = time.monotonic() + QUIET_AFTER_FAILURE_S
        if first:  # once per outage, not once per request
            logger.warning(
                "engine KV %s failed, treated as a miss (vLLM recomputes); engine calls paused "
                "for %g s: %s",
                what,
                QUIET_AFTER_FAILURE_S,
                reason,
            )

    def _run_all(
        self,
        operation: Callable[[_T], _R],
        inputs: Sequence[_T],
        deadline: float,
        what: str,
        *,
        pool: ThreadPoolExecutor | None = None,
    ) -> list[_R | None]:
        """`operation` on every input concurrently; None for each one not answered by `deadline`."""
        if not inputs or self._quiet():
            return [None] * len(inputs)
        runner = pool or self._pool
        futures: list[Future[_R]] = [runner.submit(operation, item) for item in inputs]
        done, pending = wait(futures, timeout=max(0.0, deadline - time.monotonic()))
        for future in pending:
            future.cancel()
        results: list[_R | None] = []
        for future in futures:
            if future not in done or future.exception() is not None:
                results.append(None)
                continue
            results.append(future.result())
        if pending:
            self._went_wrong(what, f"no answer within {self.timeout_s:g} s")
        elif failure := next((r for r in results if isinstance(r, Unavailable)), None):
            self._went_wrong(what, failure.reason)
        elif any(future.exception() is not None for future in futures):
            self._went_wrong(what, "the client raised")
        return results

    def _enter_background(self) -> None:
        """Run the calling thread niced, on the upload cores where they are set."""
        _lower_thread_priority()
        if self._upload_cores:
            _bind_thread(threading.get_native_id(), self._upload_cores)

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

    def _upload(self, items: list[tuple[str, bytes]], encode: Encode | None = None) -> None:
        if self._quiet():
            self.tally.add(dropped_blocks=len(items))
            return
        deadline = time.monotonic() + max(self.timeout_s, 15.0)
        outcomes = self._run_all(
            lambda item: self._put_between_steps(item, encode),
            items,
            deadline,
            "save",
            pool=self._upload_pool,
        )
        # Stored but not new: another instance saved the same block first (first writer wins).
        new = [len(value) for (_, value), o in zip(items, outcomes, strict=True) if _new(o)]
        acked = sum(isinstance(o, Stored) for o in outcomes)
        self.tally.add(
            saved_blocks=len(new), saved_bytes=sum(new), dropped_blocks=len(items) - acked
        )
        logger.debug("engine KV: saved %d new of %d blocks", len(new), len(items))

    def _put_between_steps(
        self, item: tuple[str, bytes], encode: Encode | None
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
        return self.client.put(key, encode(key, data) if encode else data)


def _new(outcome: object) -> bool:
    return isinstance(outcome, Stored) and outcome.stored_new


def _lower_thread_priority() -> None:
    """Nice the calling thread only (Linux applies setpriority to a thread id)."""
    # Off Linux, or not permitted, uploads simply run at normal priority.
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), UPLOAD_NICENESS)


def _bind_thread(thread_id: int, cores: frozenset[int]) -> None:
    """Let one thread (a Linux thread id) run on `cores` only."""
    # Off Linux, or where the cores are gone, the thread keeps its binding: only slower.
    with contextlib.suppress(OSError, AttributeError, ValueError):
        os.sched_setaffinity(thread_id, cores)


def reserved_cores() -> frozenset[int]:
    """The cores this process may use that the calling thread may not: called from vLLM's CPU
    worker's main thread after vLLM bound it to its OpenMP cores, the cores vLLM reserved for
    its other processes (`VLLM_CPU_NUM_OF_RESERVED_CPU`). Empty when OpenMP has every core, or
    off Linux.

    The process's own cores are its parent's (vLLM's EngineCore starts its workers unbound);
    the worker's mask is its OpenMP binding.
    """
    try:
        allowed = os.sched_getaffinity(os.getppid())
        bound = os.sched_getaffinity(0)
    except (OSError, AttributeError):
        return frozenset()
    return frozenset(allowed - bound)
