"""The engine's `/kv/<key>` surface: typed outcomes, batches with bounded concurrency.

`SyncKvClient` is the core (LMCache's threads call it directly); `KvClient` is the async face that
tools and services await: each call runs the sync core in a worker thread, and a batch fans out
under a capacity limiter. Keys are checked by `domain.keys` before any I/O and sent raw.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
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

IDEMPOTENT_ATTEMPTS = 3
_BACKOFF_S = (0.05, 0.15)

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
    """Blocking client for one engine; safe to share between threads."""

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
        self._wire = EngineWire(self.endpoint, token, Timeouts.from_total(timeout_s))
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
        path = "/kv/" + check_key(key)
        response = self._send("GET", path, idempotent=True)
        if isinstance(response, Unavailable):
            return response
        if response.status == 200:
            self._counters.add(gets=1, get_hits=1, bytes_read=len(response.body))
            return Hit(response.body)
        if response.status == 404:
            self._counters.add(gets=1, get_misses=1)
            return Miss()
        return self._unexpected(response)

    def put(self, key: str, value: bytes) -> PutOutcome:
        """Store `value` under `key`; the engine keeps the first value ever stored there."""
        path = "/kv/" + check_key(key)
        check_value(value)
        response = self._send("PUT", path, bytes(value), idempotent=False)
        if isinstance(response, Unavailable):
            return response
        if response.status in (200, 201):
            new = response.status == 201
            self._counters.add(
                puts=1,
                puts_stored_new=int(new),
                puts_already_present=int(not new),
                bytes_written=len(value) if new else 0,
            )
            return Stored("stored_new" if new else "already_present")
        return self._unexpected(response)

    def contains(self, key: str) -> PresenceOutcome:
        """HEAD the key: present or not, without transferring the value."""
        path = "/kv/" + check_key(key)
        response = self._send("HEAD", path, idempotent=True)
        if isinstance(response, Unavailable):
            return response
        if response.status in (200, 404):
            self._counters.add(contains_checks=1)
            return Presence(response.status == 200)
        return self._unexpected(response)

    def exists(self, key: str) -> PresenceOutcome:
        """Ask the engine's `/kv/<key>/exists` route (JSON answer; same meaning as `contains`)."""
        path = "/kv/" + check_key(key) + "/exists"
        response = self._send("GET", path, idempotent=True)
        if isinstance(response, Unavailable):
            return response
        if response.status == 200:
            try:
                answer = json.loads(response.body)
                present = answer["exists"]
            except (ValueError, KeyError, TypeError):
                return self._fail("engine sent an unreadable /exists answer", response.status)
            if isinstance(present, bool):
                self._counters.add(contains_checks=1)
                return Presence(present)
            return self._fail("engine sent a non-boolean 'exists'", response.status)
        return self._unexpected(response)

    def engine_stats(self) -> EngineStats | Unavailable:
        """The engine's own `/kv/stats`, normalized across backends."""
        response = self._send("GET", "/kv/stats", idempotent=True)
        if isinstance(response, Unavailable):
            return response
        if response.status != 200:
            return self._unexpected(response)
        try:
            return normalize_engine_stats(json.loads(response.body))
        except (ValueError, TypeError, AttributeError) as exc:
            return self._fail(f"engine sent unreadable stats ({exc})", response.status)

    def stats(self) -> StatsOutcome:
        """Engine stats + this client's counters + derived ratios."""
        engine = self.engine_stats()
        if isinstance(engine, Unavailable):
            return engine
        return build_report(engine, self.counters())

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
        attempts = IDEMPOTENT_ATTEMPTS if idempotent else 1
        for attempt in range(attempts):
            try:
                return self._wire.exchange(method, path, body)
            except WireError as exc:
                failure = exc
                if attempt + 1 < attempts:
                    pause = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
                    time.sleep(pause * (0.5 + random.random()))
        return self._fail(self._explain_fault(failure), None)

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
        return self._fail(
            explain_status(response, self.endpoint.url, self._token_given), response.status
        )

    def _fail(self, reason: str, status: int | None) -> Unavailable:
        self._counters.add(errors=1)
        return Unavailable(reason, status)


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
    """Async face of `SyncKvClient`: each call runs in a worker thread under a shared limiter."""

    def __init__(self, core: SyncKvClient) -> None:
        self.core = core
        self._limiter = anyio.CapacityLimiter(core.concurrency)

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
        return await self._run(self.core.get, key)

    async def put(self, key: str, value: bytes) -> PutOutcome:
        return await self._run(self.core.put, key, value)

    async def contains(self, key: str) -> PresenceOutcome:
        return await self._run(self.core.contains, key)

    async def exists(self, key: str) -> PresenceOutcome:
        return await self._run(self.core.exists, key)

    async def engine_stats(self) -> EngineStats | Unavailable:
        return await self._run(self.core.engine_stats)

    async def stats(self) -> StatsOutcome:
        return await self._run(self.core.stats)

    async def get_many(self, keys: Sequence[str]) -> list[Outcome[bytes]]:
        return await self._gather(self.core.get, [check_key(k) for k in keys])

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[PutOutcome]:
        checked = [(check_key(k), check_value(v)) for k, v in items]
        return await self._gather(lambda item: self.core.put(*item), checked)

    async def contains_many(self, keys: Sequence[str]) -> list[PresenceOutcome]:
        return await self._gather(self.core.contains, [check_key(k) for k in keys])

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.core.close)

    async def _run(self, function: Callable[..., R], *args: object) -> R:
        return await anyio.to_thread.run_sync(partial(function, *args), limiter=self._limiter)

    async def _gather(self, operation: Callable[[_T], R], inputs: Iterable[_T]) -> list[R]:
        items = list(inputs)
        results: list[R | None] = [None] * len(items)

        async def one(index: int, item: _T) -> None:
            results[index] = await self._run(operation, item)

        async with anyio.create_task_group() as group:
            for index, item in enumerate(items):
                group.start_soon(one, index, item)
        # Every task stored its result, or the task group raised before we got here.
        return cast(list[R], results)
