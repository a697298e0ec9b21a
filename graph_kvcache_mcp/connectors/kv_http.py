"""The engine's `/kv/<key>` surface: typed outcomes, batches with bounded concurrency.

`SyncKvClient` is the blocking client (LMCache's threads call it; batches fan out on a small
thread pool). `KvClient` is what tools and services await: it sends on the event loop itself and
bounds a batch's concurrency with a semaphore. Both read responses through the same code. Keys are
checked by `domain.keys` before any I/O and sent raw; values over the cap are refused unsent.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeAlias, TypeVar, cast

import anyio
import anyio.to_thread
from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine_wire import (
    EngineWire,
    Timeouts,
    WireError,
    WireRefused,
    WireResponse,
    WireTimeout,
)
from graph_kvcache_mcp.domain.endpoints import HttpEndpoint, parse_http_url
from graph_kvcache_mcp.domain.keys import check_key
from graph_kvcache_mcp.domain.kv_stats import (
    ClientCounters,
    EngineStats,
    KvStatsReport,
    build_report,
    normalize_engine_stats,
)
from graph_kvcache_mcp.domain.outcomes import (
    Hit,
    Miss,
    Outcome,
    Presence,
    PresenceOutcome,
    PutOutcome,
    Stored,
    Unavailable,
)
from graph_kvcache_mcp.errors import InvalidValue

MAX_VALUE_BYTES = 64 * 1024 * 1024 - 9
"""Largest value both backends store (durable adds a 9-byte frame to the 64 MiB cap)."""

_BACKOFF_S = (0.05, 0.15)
"""Idempotent requests get two retries after a transport fault; writes none."""

StatsOutcome: TypeAlias = KvStatsReport | Unavailable
R = TypeVar("R")
_T = TypeVar("_T")


def check_value(value: bytes) -> bytes:
    """Return `value` when the engine can store it.

    Raises:
        InvalidValue: the value is over the engine's cap; says the cap and how to proceed.
    """
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidValue(
            f"value is {len(value):,} bytes; the engine stores at most {MAX_VALUE_BYTES:,} "
            "(64 MiB - 9) per key: split it into smaller blocks"
        )
    return value


class _Counters:
    """Thread-safe running totals behind `ClientCounters`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = ClientCounters().model_dump()

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def snapshot(self) -> ClientCounters:
        with self._lock:
            return ClientCounters(**self._values)


class SyncKvClient:
    """Blocking client for one engine; safe to share between threads.

    Also the shared core of `KvClient`: it owns the wire, the counters, and the reading of every
    response (`read_*`), so the two faces cannot drift apart.
    """

    def __init__(
        self,
        base_url: str,
        token: SecretStr | None,
        *,
        timeout_s: float = 5.0,
        concurrency: int = 8,
    ) -> None:
        self.endpoint: HttpEndpoint = parse_http_url(base_url, what="KV base URL")
        self.concurrency = concurrency
        self.wire = EngineWire(self.endpoint, token, Timeouts.from_total(timeout_s))
        self._counters = _Counters()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._token_given = token is not None

    def __repr__(self) -> str:
        return f"SyncKvClient({self.endpoint.url!r})"

    @property
    def base_url(self) -> str:
        return self.endpoint.url

    def counters(self) -> ClientCounters:
        return self._counters.snapshot()

    # --- single operations -------------------------------------------------------------------

    def get(self, key: str) -> Outcome[bytes]:
        """Read one block: `Hit(bytes)`, `Miss()`, or `Unavailable(reason)`."""
        return self.read_get(self._send("GET", block_path(key), idempotent=True))

    def put(self, key: str, value: bytes) -> PutOutcome:
        """Store `value` under `key`; the engine keeps the first value ever stored there."""
        path, body = block_path(key), check_value(bytes(value))
        return self.read_put(self._send("PUT", path, body, idempotent=False), len(body))

    def contains(self, key: str) -> PresenceOutcome:
        """HEAD the key: present or not, without transferring the value."""
        return self.read_contains(self._send("HEAD", block_path(key), idempotent=True))

    def exists(self, key: str) -> PresenceOutcome:
        """Ask the engine's `/kv/<key>/exists` route (JSON answer; same meaning as `contains`)."""
        path = block_path(key) + "/exists"
        return self.read_exists(self._send("GET", path, idempotent=True))

    def engine_stats(self) -> EngineStats | Unavailable:
        """The engine's own `/kv/stats`, normalized across backends."""
        return self.read_engine_stats(self._send("GET", STATS_PATH, idempotent=True))

    def stats(self) -> StatsOutcome:
        """Engine stats + this client's counters + derived ratios."""
        return self.report(self.engine_stats())

    # --- batches -----------------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> list[Outcome[bytes]]:
        """Read many keys concurrently; results in input order, each typed on its own."""
        return self._fan_out(self.get, [check_key(k) for k in keys])

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[PutOutcome]:
        """Store many (key, value) pairs concurrently; results in input order."""
        checked = [(check_key(k), check_value(v)) for k, v in items]
        return self._fan_out(lambda item: self.put(*item), checked)

    def contains_many(self, keys: Sequence[str]) -> list[PresenceOutcome]:
        """HEAD many keys concurrently; results in input order."""
        return self._fan_out(self.contains, [check_key(k) for k in keys])

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> SyncKvClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reading responses (shared with KvClient) --------------------------------------------

    def read_get(self, response: WireResponse | Unavailable) -> Outcome[bytes]:
        if isinstance(response, Unavailable):
            return response
        if response.status == 200:
            self._counters.add(gets=1, get_hits=1, bytes_read=len(response.body))
            return Hit(response.body)
        if response.status == 404:
            self._counters.add(gets=1, get_misses=1)
            return Miss()
        return self._unexpected(response)

    def read_put(self, response: WireResponse | Unavailable, size: int) -> PutOutcome:
        if isinstance(response, Unavailable):
            return response
        if response.status in (200, 201):
            new = response.status == 201
            self._counters.add(
                puts=1,
                puts_stored_new=int(new),
                puts_already_present=int(not new),
                bytes_written=size if new else 0,
            )
            return Stored("stored_new" if new else "already_present")
        return self._unexpected(response)

    def read_contains(self, response: WireResponse | Unavailable) -> PresenceOutcome:
        if isinstance(response, Unavailable):
            return response
        if response.status in (200, 404):
            self._counters.add(contains_checks=1)
            return Presence(response.status == 200)
        return self._unexpected(response)

    def read_exists(self, response: WireResponse | Unavailable) -> PresenceOutcome:
        if isinstance(response, Unavailable):
            return response
        if response.status != 200:
            return self._unexpected(response)
        try:
            present = json.loads(response.body)["exists"]
        except (ValueError, KeyError, TypeError):
            return self._fail("engine sent an unreadable /exists answer", response.status)
        if not isinstance(present, bool):
            return self._fail("engine sent a non-boolean 'exists'", response.status)
        self._counters.add(contains_checks=1)
        return Presence(present)

    def read_engine_stats(self, response: WireResponse | Unavailable) -> EngineStats | Unavailable:
        if isinstance(response, Unavailable):
            return response
        if response.status != 200:
            return self._unexpected(response)
        try:
            return normalize_engine_stats(json.loads(response.body))
        except (ValueError, TypeError, AttributeError) as exc:
            return self._fail(f"engine sent unreadable stats ({exc})", response.status)

    def report(self, engine: EngineStats | Unavailable) -> StatsOutcome:
        if isinstance(engine, Unavailable):
            return engine
        return build_report(engine, self.counters())

    def give_up(self, exc: WireError) -> Unavailable:
        """The `Unavailable` for a request whose every attempt failed."""
        return self._fail(self._explain_fault(exc), None)

    def note_retry(self) -> None:
        self._counters.add(retries=1)

    # --- internals ---------------------------------------------------------------------------

    def _fan_out(self, operation: Callable[[_T], R], inputs: list[_T]) -> list[R]:
        if len(inputs) <= 1:
            return [operation(item) for item in inputs]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="kv-batch")
            pool = self._pool
        return list(pool.map(operation, inputs))

    def _send(
        self, method: str, path: str, body: bytes | None = None, *, idempotent: bool
    ) -> WireResponse | Unavailable:
        pauses = retry_pauses(idempotent)
        while True:
            try:
                return self.wire.exchange(method, path, body)
            except WireError as exc:
                pause = next(pauses, None)
                if pause is None:
                    return self.give_up(exc)
                self.note_retry()
                time.sleep(pause)

    def _explain_fault(self, exc: WireError) -> str:
        where = f"engine at {self.endpoint.url}"
        if isinstance(exc, WireRefused):
            return (
                f"{where} is not reachable (connection refused): start one with "
                "`graph-kvcache-mcp engine start` or check EPISTEMIC_GRAPH_KVCACHE_URL"
            )
        if isinstance(exc, WireTimeout):
            return f"{where} timed out ({exc}); it may be overloaded or hung"
        return f"{where} failed: {exc}"

    def _unexpected(self, response: WireResponse) -> Unavailable:
        reason = explain_status(response, self.endpoint.url, self._token_given)
        return self._fail(reason, response.status)

    def _fail(self, reason: str, status: int | None) -> Unavailable:
        self._counters.add(errors=1)
        return Unavailable(reason, status)


STATS_PATH = "/kv/stats"


def block_path(key: str) -> str:
    """The request path for `key`, checked against the engine's key rules (raises InvalidKey)."""
    return "/kv/" + check_key(key)


def retry_pauses(idempotent: bool) -> Iterator[float]:
    """Pauses before each retry: none for writes, jittered backoff for idempotent reads."""
    if not idempotent:
        return iter(())
    return iter(pause * (0.5 + random.random()) for pause in _BACKOFF_S)


def explain_status(response: WireResponse, url: str, token_given: bool) -> str:
    """A reason for an unexpected status that says what to do; never echoes the token."""
    message = ""
    if response.content_type.startswith("application/json"):
        try:
            message = str(json.loads(response.body).get("message", ""))[:200]
        except (ValueError, AttributeError):
            message = ""
    if response.status == 401:
        fix = (
            "set EPISTEMIC_GRAPH_KVCACHE_TOKEN to the engine's token"
            if not token_given
            else "EPISTEMIC_GRAPH_KVCACHE_TOKEN does not match the engine's token"
        )
        return f"engine at {url} refused the bearer token (401): {fix}"
    if response.status == 400:
        return (
            f"engine at {url} refused the request as malformed (400 {message or 'bad request'}); "
            "check the key and that the value is within 64 MiB"
        )
    if response.status >= 500:
        return f"engine at {url} failed ({response.status} {message or 'server error'})"
    return f"engine at {url} answered {response.status} {message}".rstrip()


class KvClient:
    """Async client: sends on the event loop's own sockets (see `engine_wire`), sharing the wire,
    counters and response reading of the `SyncKvClient` it is built on."""

    def __init__(self, core: SyncKvClient) -> None:
        self.core = core
        self._limit = anyio.Semaphore(core.concurrency)

    @classmethod
    def connect(
        cls,
        base_url: str,
        token: SecretStr | None,
        *,
        timeout_s: float = 5.0,
        concurrency: int = 8,
    ) -> KvClient:
        return cls(SyncKvClient(base_url, token, timeout_s=timeout_s, concurrency=concurrency))

    def __repr__(self) -> str:
        return f"KvClient({self.core.base_url!r})"

    @property
    def base_url(self) -> str:
        return self.core.base_url

    def counters(self) -> ClientCounters:
        return self.core.counters()

    async def get(self, key: str) -> Outcome[bytes]:
        """Read one block: `Hit(bytes)`, `Miss()`, or `Unavailable(reason)`."""
        return self.core.read_get(await self._send("GET", block_path(key), idempotent=True))

    async def put(self, key: str, value: bytes) -> PutOutcome:
        """Store `value` under `key`; the engine keeps the first value ever stored there."""
        path, body = block_path(key), check_value(bytes(value))
        response = await self._send("PUT", path, body, idempotent=False)
        return self.core.read_put(response, len(body))

    async def contains(self, key: str) -> PresenceOutcome:
        """HEAD the key: present or not, without transferring the value."""
        return self.core.read_contains(await self._send("HEAD", block_path(key), idempotent=True))

    async def exists(self, key: str) -> PresenceOutcome:
        """Ask the engine's `/kv/<key>/exists` route."""
        path = block_path(key) + "/exists"
        return self.core.read_exists(await self._send("GET", path, idempotent=True))

    async def engine_stats(self) -> EngineStats | Unavailable:
        """The engine's own `/kv/stats`, normalized across backends."""
        return self.core.read_engine_stats(await self._send("GET", STATS_PATH, idempotent=True))

    async def stats(self) -> StatsOutcome:
        """Engine stats + this client's counters + derived ratios."""
        return self.core.report(await self.engine_stats())

    async def get_many(self, keys: Sequence[str]) -> list[Outcome[bytes]]:
        """Read many keys concurrently (bounded); results in input order."""
        return await self._gather(self.get, [check_key(k) for k in keys])

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[PutOutcome]:
        """Store many (key, value) pairs concurrently (bounded); results in input order."""
        checked = [(check_key(k), check_value(v)) for k, v in items]
        return await self._gather(lambda item: self.put(*item), checked)

    async def contains_many(self, keys: Sequence[str]) -> list[PresenceOutcome]:
        """HEAD many keys concurrently (bounded); results in input order."""
        return await self._gather(self.contains, [check_key(k) for k in keys])

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.core.close)

    async def _send(
        self, method: str, path: str, body: bytes | None = None, *, idempotent: bool
    ) -> WireResponse | Unavailable:
        pauses = retry_pauses(idempotent)
        while True:
            try:
                async with self._limit:
                    return await self.core.wire.exchange_async(method, path, body)
            except WireError as exc:
                pause = next(pauses, None)
                if pause is None:
                    return self.core.give_up(exc)
                self.core.note_retry()
                await anyio.sleep(pause)

    async def _gather(
        self, operation: Callable[[_T], Awaitable[R]], inputs: Iterable[_T]
    ) -> list[R]:
        items = list(inputs)
        results: list[R | None] = [None] * len(items)

        async def one(index: int, item: _T) -> None:
            results[index] = await operation(item)

        async with anyio.create_task_group() as group:
            for index, item in enumerate(items):
                group.start_soon(one, index, item)
        # Every task stored its result, or the task group raised before we got here.
        return cast(list[R], results)
