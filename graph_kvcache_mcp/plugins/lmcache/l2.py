"""The engine as LMCache's L2 tier: a `native_plugin` client for `lmcache server --l2-adapter`.

LMCache's `NativeConnectorL2Adapter` drives this object (lmcache 0.5.6, reference §5):
`submit_batch_set/get/exists` return a future id at once; the work runs on our threads; each
finished batch is queued and signalled on one non-blocking Linux eventfd; the adapter's demux
thread polls the fd and calls `drain_completions()`, which resets it and hands back
`(future_id, ok, error, result_bools)` tuples.

Rules this client keeps, because LMCache trusts it with locked L1 memory:
- Keys of one batch go to the engine concurrently (bounded by `max_connections`), through the
  package's one HTTP core (`SyncKvClient`); `num_workers` batches run side by side.
- Nothing raises into LMCache once constructed: a refused token, a dead engine, a timeout or a 5xx
  becomes a per-key False and an error string. `ok` is True only when no key failed.
- A set copies its buffers before `submit_batch_set` returns. A get fills a buffer only from a
  stored block of exactly its size (anything else is a miss that leaves it untouched), received
  through reused slots (`BufferSink`); a block cut short is a miss too, its buffer partly
  written, as LMCache drops it. No byte reaches a buffer after the batch has completed: the
  batch's `WriteWindow` closes first (LMCache frees the buffers of a failed load at once).
- After `close()` a submit is answered with a failed completion, never an exception.

Pure Python, importable without lmcache installed. Engine keys come from `domain.lmcache.keys`.
There is no `submit_batch_delete`: the engine has no DELETE route (leave `max_capacity_gb` at 0).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias

from graph_kvcache_mcp.connectors.engine.buffer_sink import BufferSink, SlotPool, WriteWindow
from graph_kvcache_mcp.connectors.engine.opener import sync_client_from_params
from graph_kvcache_mcp.domain.engine.limits import MAX_VALUE_BYTES
from graph_kvcache_mcp.domain.lmcache.keys import DEFAULT_NAMESPACE, check_namespace, engine_key
from graph_kvcache_mcp.domain.outcomes import Hit, Miss, Presence, Stored, Unavailable

logger = logging.getLogger(__name__)

Completion: TypeAlias = tuple[int, bool, str, list[bool] | None]
"""`(future_id, ok, error_message, result_bools)`, the tuple LMCache's adapter expects."""

DEFAULT_NUM_WORKERS = 4
DEFAULT_MAX_CONNECTIONS = 16
"""When neither `adapter_params` nor the environment says: a 64-key batch of 256 KiB pages moved
fastest with 16-32 requests in flight on a 2-core host (tools/bench_l2.py), 8 was clearly slower."""
_CONNECTIONS_ENV = "EPISTEMIC_GRAPH_KVCACHE_MAX_CONNECTIONS"
_MAX_REASONS = 3
_MAX_LOGGED_REASONS = 64


class EngineL2Client:
    """LMCache `native_plugin` client storing chunks in the engine's `/kv/<key>` store.

    `adapter_params` become these keyword arguments; whatever is missing comes from the
    environment (`EPISTEMIC_GRAPH_KVCACHE_URL`/`_ADDR`, `_TOKEN`, `_TIMEOUT_S`,
    `_MAX_CONNECTIONS`), then from a managed engine recorded in the data dir, then the defaults
    (http://127.0.0.1:9130, 16 connections). Prefer the environment for the token: LMCache logs
    `adapter_params`.

    Raises:
        ConfigError: a parameter (URL, namespace, number) cannot be used as given.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        addr: str | None = None,
        token: str | None = None,
        timeout_s: float | None = None,
        num_workers: int | None = None,
        max_connections: int | None = None,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        if max_connections is None and not os.environ.get(_CONNECTIONS_ENV, "").strip():
            max_connections = DEFAULT_MAX_CONNECTIONS
        self.core = sync_client_from_params(
            base_url=base_url,
            addr=addr,
            token=token,
            timeout_s=timeout_s,
            concurrency=max_connections,
        )
        self.namespace = check_namespace(namespace)
        workers = DEFAULT_NUM_WORKERS if num_workers is None else int(num_workers)
        self.num_workers = max(1, workers)
        self._batches = ThreadPoolExecutor(self.num_workers, thread_name_prefix="lmcache-l2")
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._queue: list[Completion] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._slots = SlotPool()
        self._reasons = _ReasonLog()
        self._closed = False
        logger.info(
            "LMCache L2 client for %s (namespace %r, %d batch workers, %d connections)",
            self.core.base_url,
            self.namespace,
            self.num_workers,
            self.core.concurrency,
        )

    def __repr__(self) -> str:
        return f"EngineL2Client({self.core.base_url!r}, namespace={self.namespace!r})"

    @property
    def closed(self) -> bool:
        return self._closed

    # --- the native_plugin contract --------------------------------------------------------

    def event_fd(self) -> int:
        """The eventfd that becomes readable while completions are queued (-1 after close)."""
        return self._efd

    def submit_batch_set(self, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        """Store each buffer under its key; the bytes are copied before this returns."""
        try:
            payloads = [bytes(view) for view in memoryviews]
        except (TypeError, ValueError, BufferError) as exc:
            reason = f"set buffers could not be read ({type(exc).__name__})"
            self._reasons.note("store", reason)
            return self._refuse(reason)
        return self._submit(self._run_set, list(keys), payloads)

    def submit_batch_get(self, keys: Sequence[str], memoryviews: Sequence[Any]) -> int:
        """Fill each writable buffer with its key's block; a result per key."""
        return self._submit(self._run_get, list(keys), list(memoryviews))

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        """Whether each key is stored; a result per key."""
        return self._submit(self._run_exists, list(keys))

    def drain_completions(self) -> list[Completion]:
        """Everything finished since the last drain (`[]` when nothing); resets the eventfd.

        The counter is read before the queue is swapped, so a batch finishing in between is
        either in this drain or re-arms the fd for the next one; it is never lost.
        """
        with self._lock:
            if self._efd >= 0:
                # BlockingIOError: the counter was already 0 (a spurious or late wake-up).
                with contextlib.suppress(BlockingIOError, OSError):
                    os.eventfd_read(self._efd)
            done, self._queue = self._queue, []
        return done

    def close(self) -> None:
        """Finish in-flight batches, release the HTTP core, close the eventfd. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._batches.shutdown(wait=True)
        self.core.close()
        with self._lock:
            fd, self._efd = self._efd, -1
        if fd >= 0:
            os.close(fd)

    # --- batches ---------------------------------------------------------------------------

    def _submit(self, work: Callable[..., tuple[bool, str, list[bool] | None]], *args: Any) -> int:
        future_id = next(self._ids)
        if self._closed:
            self._complete(future_id, False, "L2 client is closed", None)
            return future_id
        try:
            self._batches.submit(self._run, future_id, work, *args)
        except RuntimeError:  # shut down between the check and the submit
            self._complete(future_id, False, "L2 client is closed", None)
        return future_id

    def _refuse(self, reason: str) -> int:
        future_id = next(self._ids)
        self._complete(future_id, False, reason, None)
        return future_id

    def _run(
        self,
        future_id: int,
        work: Callable[..., tuple[bool, str, list[bool] | None]],
        *args: Any,
    ) -> None:
        try:
            ok, error, results = work(*args)
        except Exception as exc:  # never let a bug escape into LMCache's threads
            logger.exception("LMCache L2 batch %d failed", future_id)
            ok, error, results = False, f"L2 batch failed ({type(exc).__name__}: {exc})", None
        self._complete(future_id, ok, error, results)

    def _complete(self, future_id: int, ok: bool, error: str, results: list[bool] | None) -> None:
        with self._lock:
            self._queue.append((future_id, ok, error, results))
            if self._efd >= 0:
                os.eventfd_write(self._efd, 1)

    def _engine_keys(self, keys: list[str], failures: _Failures) -> list[str | None]:
        mapped: list[str | None] = []
        for key in keys:
            try:
                mapped.append(engine_key(str(key), namespace=self.namespace))
            except ValueError as exc:
                failures.add(f"unusable LMCache key ({exc})")
                mapped.append(None)
        return mapped

    def _run_set(self, keys: list[str], payloads: list[bytes]) -> tuple[bool, str, None]:
        failures = _Failures(self._reasons, "store")
        if len(keys) != len(payloads):
            return False, f"{len(keys)} keys but {len(payloads)} buffers", None
        items: list[tuple[str, bytes]] = []
        for engine, payload in zip(self._engine_keys(keys, failures), payloads, strict=True):
            if engine is None:
                continue
            if len(payload) > MAX_VALUE_BYTES:
                failures.add(
                    f"chunk of {len(payload):,} bytes is over the engine's {MAX_VALUE_BYTES:,}-byte"
                    " value cap: lower LMCache's chunk size"
                )
                continue
            items.append((engine, payload))
        for outcome in self.core.put_many(items):
            if isinstance(outcome, Unavailable):
                failures.add(outcome.reason)
            elif not isinstance(outcome, Stored):  # pragma: no cover - the outcome union is closed
                failures.add("unexpected put outcome")
        return failures.ok, failures.message(len(keys), "set"), None

    def _run_get(self, keys: list[str], views: list[Any]) -> tuple[bool, str, list[bool]]:
        failures = _Failures(self._reasons, "load")
        if len(keys) != len(views):
            return False, f"{len(keys)} keys but {len(views)} buffers", [False] * len(keys)
        window = WriteWindow()
        wanted: list[tuple[int, str, BufferSink]] = []
        for index, (key, view) in enumerate(
            zip(self._engine_keys(keys, failures), views, strict=True)
        ):
            buffer = _load_buffer(view, failures)
            if key is not None and buffer is not None:
                wanted.append((index, key, BufferSink(buffer, window, self._slots)))
        try:
            outcomes = self.core.get_many_into(
                [key for _, key, _ in wanted],
                [sink for _, _, sink in wanted],
                expect_bytes=sum(len(sink.buffer) for _, _, sink in wanted),
            )
        finally:
            window.close()  # from here on no lane writes into LMCache's buffers
        loaded = [False] * len(keys)
        for (index, _, sink), outcome in zip(wanted, outcomes, strict=True):
            if isinstance(outcome, Hit):
                problem = sink.problem()
                loaded[index] = problem is None
                if problem is not None:
                    failures.add(f"{problem}: treated as a miss")
            elif isinstance(outcome, Unavailable):
                failures.add(outcome.reason)
            elif not isinstance(outcome, Miss):  # pragma: no cover - the outcome union is closed
                failures.add("unexpected get outcome")
        return failures.ok, failures.message(len(keys), "get"), loaded

    def _run_exists(self, keys: list[str]) -> tuple[bool, str, list[bool]]:
        failures = _Failures(self._reasons, "lookup")
        mapped = self._engine_keys(keys, failures)
        wanted = [(i, key) for i, key in enumerate(mapped) if key is not None]
        outcomes = self.core.contains_many([key for _, key in wanted])
        present = [False] * len(keys)
        for (index, _), outcome in zip(wanted, outcomes, strict=True):
            if isinstance(outcome, Presence):
                present[index] = outcome.present
            else:
                failures.add(outcome.reason)
        return failures.ok, failures.message(len(keys), "exists"), present


def _load_buffer(view: Any, failures: _Failures) -> memoryview | None:
    """LMCache's buffer as a writable byte view (its format is '<B': cast to slice it)."""
    try:
        target = memoryview(view).cast("B")
    except (TypeError, ValueError) as exc:
        failures.add(f"load buffer unusable ({type(exc).__name__})")
        return None
    if target.readonly:
        failures.add("load buffer is read-only")
        return None
    return target


class _ReasonLog:
    """Logs why a batch failed, once per distinct reason: LMCache logs only that a store task
    failed and for which keys, never the error string we hand back, so without this a refused
    token or an untrusted certificate would fail every store silently. Reasons come from the
    engine client's `Unavailable`s, which never hold the token. Bounded, so a flood of distinct
    reasons cannot grow it without end."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def note(self, what: str, reason: str) -> None:
        with self._lock:
            if (what, reason) in self._seen or len(self._seen) >= _MAX_LOGGED_REASONS:
                return
            self._seen.add((what, reason))
        logger.warning("LMCache L2 %s failed: %s (logged once per reason)", what, reason)


class _Failures:
    """Per-batch failure tally: how many keys failed, and the first few distinct reasons (each
    logged the first time the client meets it)."""

    def __init__(self, log: _ReasonLog, what: str) -> None:
        self.count = 0
        self.reasons: list[str] = []
        self._log = log
        self._what = what

    @property
    def ok(self) -> bool:
        return self.count == 0

    def add(self, reason: str) -> None:
        self.count += 1
        self._log.note(self._what, reason)
        if reason not in self.reasons and len(self.reasons) < _MAX_REASONS:
            self.reasons.append(reason)

    def message(self, total: int, what: str) -> str:
        if self.ok:
            return ""
        return f"{what}: {self.count} of {total} keys failed: " + "; ".join(self.reasons)


def wait_for_completion(
    client: EngineL2Client, future_id: int, *, timeout_s: float = 30.0
) -> Completion | None:
    """Poll the client's eventfd and drain until `future_id` completes (None on timeout).

    For callers that own the client and run one batch at a time (the adapter check, benchmarks,
    tests): completions of other batches drained on the way are dropped. LMCache's adapter drains
    on its own and never calls this.
    """
    poller = select.poll()
    fd = client.event_fd()
    if fd >= 0:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout_s
    while True:
        for completion in client.drain_completions():
            if completion[0] == future_id:
                return completion
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if fd < 0:  # closed: whatever was queued has been drained above
            return None
        poller.poll(max(1, min(int(left * 1000), 500)))
