"""The engine's `/kv/<key>` surface: typed outcomes, batches with bounded concurrency.

`SyncKvClient` is the blocking client (LMCache's threads call it; batches fan out on a thread
pool). `KvClient` is what tools and services await: it sends on the event loop itself. Both read
responses through the same code. Keys are checked by `domain.keys` before any I/O and sent raw;
values over the cap are refused unsent.

One deadline per call: every public method, a batch included, makes one `Deadline` of
`timeout_s` (plus upload time for request bodies, `engine_limits.call_budget_s`) that bounds all it
does: connecting, sending, reading, waiting for a lane of its batch, and retrying. Only a
connection refused or reset before a byte was sent is retried; a timeout never is. Each call fans
out on lanes of its own (at most `concurrency` requests in flight per call) and never waits behind
another call's requests, so one caller stuck on a hung engine holds no other caller past its own
deadline.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from itertools import count
from typing import Literal, TypeAlias, TypeVar

import anyio
import anyio.to_thread
from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine_wire import (
    Deadline,
    EngineWire,
    WireError,
    WireRefused,
    WireTimeout,
    WireUnsent,
)
from graph_kvcache_mcp.connectors.http_response import WireResponse
from graph_kvcache_mcp.domain.endpoints import HttpEndpoint, parse_http_url
from graph_kvcache_mcp.domain.engine_limits import (
    ENGINE_REQUEST_DEADLINE_S,
    EXISTS_ROUTE_SUFFIX,
    KEY_BYTES_ANY_BACKEND,
    KV_ROUTE_PREFIX,
    MAX_VALUE_BYTES,
    EngineBackend,
    call_budget_s,
    check_value,
)
from graph_kvcache_mcp.domain.keys import check_exists_key, check_key
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

_BACKOFF_S = (0.05, 0.15)
"""A request that never left (connection refused or reset before a byte went out) is sent again
after these pauses, while the call's deadline allows."""

_LANE_GRACE_S = 0.25
"""How long past its deadline a batch waits for lanes to hand back (their sockets time out at the
deadline itself; this only covers thread scheduling)."""

_POOL_LANES_PER_SLOT = 4
"""The sync client's thread pool holds this many lanes per unit of `concurrency`, so that a few
batches stuck on a hung engine leave threads for everyone else."""

StatsOutcome: TypeAlias = KvStatsReport | Unavailable
EngineSource: TypeAlias = Literal["configured", "managed", "default"]
"""Where the engine's address came from: it decides what a reason tells the caller to do."""
ReportedBackend: TypeAlias = EngineBackend | Literal["unknown"]
R = TypeVar("R")
_T = TypeVar("_T")


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
        source: EngineSource = "configured",
        backend: EngineBackend | None = None,
    ) -> None:
        self.endpoint: HttpEndpoint = parse_http_url(base_url, what="KV base URL")
        self.source = source
        self.backend: ReportedBackend | None = backend
        """The engine's backend, whose key limit applies: given (a managed engine's state knows
        it), else learned from the first `/kv/stats` answer; None until then."""
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.wire = EngineWire(self.endpoint, token)
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

    def deadline(self, body_bytes: int = 0) -> Deadline:
        """The deadline of a call starting now that sends `body_bytes` of request bodies."""
        return Deadline.after(call_budget_s(self.timeout_s, body_bytes))

    def get(self, key: str) -> Outcome[bytes]:
        """Read one block: `Hit(bytes)`, `Miss()`, or `Unavailable(reason)`."""
        deadline = self.deadline()
        paths = self._paths([key], deadline)
        return paths if isinstance(paths, Unavailable) else self._get(paths[0], deadline)

    def put(self, key: str, value: bytes) -> PutOutcome:
        """Store `value` under `key`; the engine keeps the first value ever stored there."""
        body = check_value(bytes(value))
        deadline = self.deadline(len(body))
        paths = self._paths([key], deadline)
        return paths if isinstance(paths, Unavailable) else self._put(paths[0], body, deadline)

    def contains(self, key: str) -> PresenceOutcome:
        """HEAD the key: present or not, without transferring the value."""
        deadline = self.deadline()
        paths = self._paths([key], deadline)
        return paths if isinstance(paths, Unavailable) else self._contains(paths[0], deadline)

    def exists(self, key: str) -> PresenceOutcome:
        """Ask the engine's `/kv/<key>/exists` route (JSON answer; same meaning as `contains`)."""
        deadline = self.deadline()
        paths = self._paths([check_exists_key(key)], deadline)
        if isinstance(paths, Unavailable):
            return paths
        return self.read_exists(self._send("GET", paths[0] + EXISTS_ROUTE_SUFFIX, None, deadline))

    def engine_stats(self) -> EngineStats | Unavailable:
        """The engine's own `/kv/stats`, normalized across backends."""
        return self._engine_stats(self.deadline())

    def stats(self) -> StatsOutcome:
        """Engine stats + this client's counters + derived ratios."""
        return self.report(self.engine_stats())

    # --- batches -----------------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> list[Outcome[bytes]]:
        """Read many keys concurrently; results in input order, each typed on its own."""
        deadline = self.deadline()
        paths = self._paths(keys, deadline)
        if isinstance(paths, Unavailable):
            return [paths] * len(keys)
        return self._fan_out(lambda path: self._get(path, deadline), paths, deadline)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[PutOutcome]:
        """Store many (key, value) pairs concurrently; results in input order."""
        bodies = [check_value(bytes(value)) for _, value in items]
        deadline = self.deadline(sum(len(body) for body in bodies))
        paths = self._paths([key for key, _ in items], deadline)
        if isinstance(paths, Unavailable):
            return [paths] * len(items)
        pairs = list(zip(paths, bodies, strict=True))
        return self._fan_out(lambda pair: self._put(*pair, deadline), pairs, deadline)

    def contains_many(self, keys: Sequence[str]) -> list[PresenceOutcome]:
        """HEAD many keys concurrently; results in input order."""
        deadline = self.deadline()
        paths = self._paths(keys, deadline)
        if isinstance(paths, Unavailable):
            return [paths] * len(keys)
        return self._fan_out(lambda path: self._contains(path, deadline), paths, deadline)

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
            stats = normalize_engine_stats(json.loads(response.body))
        except (ValueError, TypeError, AttributeError) as exc:
            return self._fail(f"engine sent unreadable stats ({exc})", response.status)
        self.backend = stats.backend
        return stats

    def report(self, engine: EngineStats | Unavailable) -> StatsOutcome:
        if isinstance(engine, Unavailable):
            return engine
        return build_report(engine, self.counters())

    def give_up(self, exc: WireError) -> Unavailable:
        """The `Unavailable` for a request whose every attempt failed."""
        return self._fail(self._explain_fault(exc), None)

    def retry_pause(self, exc: WireError, pauses: Iterator[float], deadline: Deadline) -> float:
        """How long to pause before sending again after `exc`, or -1 to give up.

        Only a request that never left is sent again, and only when the pause leaves time to.
        """
        if not isinstance(exc, WireUnsent):
            return -1.0
        pause = next(pauses, None)
        if pause is None or pause >= deadline.remaining_s():
            return -1.0
        self._counters.add(retries=1)
        return pause

    def needs_backend(self, keys: list[str]) -> bool:
        """Whether checking `keys` must wait for the engine to say its backend (a key longer than
        every backend stores, while the backend is not known yet)."""
        return self.backend is None and any(len(key) > KEY_BYTES_ANY_BACKEND for key in keys)

    def paths_for(self, keys: list[str]) -> list[str]:
        """Request paths for keys already checked against the rules every backend shares, now
        against the engine's own key limit (raises InvalidKey, naming the backend)."""
        backend = self.backend or "unknown"
        return [KV_ROUTE_PREFIX + check_key(key, backend=backend) for key in keys]

    def timed_out(self, deadline: Deadline) -> Unavailable:
        """The answer for a request the call's deadline left no time to start."""
        return self.give_up(WireTimeout("queue", deadline.budget_s))

    # --- internals ---------------------------------------------------------------------------

    def _paths(self, keys: Sequence[str], deadline: Deadline) -> list[str] | Unavailable:
        """Request paths for `keys`, each checked before any request of its own is sent.

        Raises:
            InvalidKey: the first key that breaks a rule.
        """
        checked = [check_key(key, backend=self.backend or "any") for key in keys]
        if self.needs_backend(checked):
            learned = self._engine_stats(deadline)
            if isinstance(learned, Unavailable):
                return learned
        return self.paths_for(checked)

    def _engine_stats(self, deadline: Deadline) -> EngineStats | Unavailable:
        return self.read_engine_stats(self._send("GET", STATS_PATH, None, deadline))

    def _get(self, path: str, deadline: Deadline) -> Outcome[bytes]:
        return self.read_get(self._send("GET", path, None, deadline))

    def _put(self, path: str, body: bytes, deadline: Deadline) -> PutOutcome:
        return self.read_put(self._send("PUT", path, body, deadline), len(body))

    def _contains(self, path: str, deadline: Deadline) -> PresenceOutcome:
        return self.read_contains(self._send("HEAD", path, None, deadline))

    def _fan_out(
        self, operation: Callable[[_T], R], inputs: list[_T], deadline: Deadline
    ) -> list[R | Unavailable]:
        """`operation` over `inputs` on at most `concurrency` lanes of this call's own; the
        calling thread runs one lane itself. Inputs no lane reached by the deadline time out."""
        if len(inputs) <= 1:
            return [operation(item) for item in inputs]
        results: list[R | Unavailable | None] = [None] * len(inputs)
        cursor = count()  # next() on itertools.count is atomic under the GIL: lanes share it

        def lane() -> None:
            while (index := next(cursor)) < len(inputs):
                if deadline.remaining_s() <= 0:
                    results[index] = self.timed_out(deadline)
                else:
                    results[index] = operation(inputs[index])

        pool = self._lane_pool()
        helpers = [pool.submit(lane) for _ in range(min(self.concurrency, len(inputs)) - 1)]
        lane()
        _, late = wait(helpers, timeout=max(0.0, deadline.remaining_s()) + _LANE_GRACE_S)
        for future in late:
            future.cancel()  # a helper still queued behind other calls' lanes never starts
        return [self.timed_out(deadline) if result is None else result for result in results]

    def _lane_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.concurrency * _POOL_LANES_PER_SLOT, thread_name_prefix="kv-lane"
                )
            return self._pool

    def _send(
        self, method: str, path: str, body: bytes | None, deadline: Deadline
    ) -> WireResponse | Unavailable:
        pauses = retry_pauses()
        while True:
            if deadline.remaining_s() <= 0:
                return self.timed_out(deadline)
            try:
                return self.wire.exchange(method, path, body, deadline=deadline)
            except WireError as exc:
                pause = self.retry_pause(exc, pauses, deadline)
                if pause < 0:
                    return self.give_up(exc)
                time.sleep(pause)

    def _explain_fault(self, exc: WireError) -> str:
        where = f"engine at {self.endpoint.url}"
        ours = self.source != "configured"
        if isinstance(exc, WireRefused):
            if ours:
                return (
                    f"{where} is not reachable (connection refused): start the managed engine "
                    "with the engine_start tool or `graph-kvcache-mcp engine start`, or set "
                    "EPISTEMIC_GRAPH_KVCACHE_URL to an engine that runs"
                )
            return (
                f"{where} is not reachable (connection refused): check that the engine runs "
                "there and that EPISTEMIC_GRAPH_KVCACHE_URL (or _ADDR) names it"
            )
        if isinstance(exc, WireTimeout):
            check = (
                "; engine_status (tool) or `graph-kvcache-mcp engine status` shows whether it runs"
                if ours
                else ""
            )
            return (
                f"{where} timed out after {exc.budget_s:g} s ({exc}): the engine may be hung or "
                f"overloaded; if it is only slow, raise EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S{check}"
            )
        return f"{where} failed: {exc}"

    def _unexpected(self, response: WireResponse) -> Unavailable:
        reason = explain_status(response, self.endpoint.url, self._token_given)
        return self._fail(reason, response.status)

    def _fail(self, reason: str, status: int | None) -> Unavailable:
        self._counters.add(errors=1)
        return Unavailable(reason, status)


STATS_PATH = KV_ROUTE_PREFIX + "stats"


def retry_pauses() -> Iterator[float]:
    """Jittered pauses before each resend of a request that never left."""
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
            f"check the key and that the value is within {MAX_VALUE_BYTES:,} bytes (the engine "
            f"also refuses a request it has not fully received within "
            f"{ENGINE_REQUEST_DEADLINE_S:g} s)"
        )
    if response.status >= 500:
        return f"engine at {url} failed ({response.status} {message or 'server error'})"
    return f"engine at {url} answered {response.status} {message}".rstrip()


class KvClient:
    """Async client: sends on the event loop's own sockets (see `engine_wire`), sharing the wire,
    counters and response reading of the `SyncKvClient` it is built on."""

    def __init__(self, core: SyncKvClient) -> None:
        self.core = core

    @classmethod
    def connect(
        cls,
        base_url: str,
        token: SecretStr | None,
        *,
        timeout_s: float = 5.0,
        concurrency: int = 8,
        source: EngineSource = "configured",
        backend: EngineBackend | None = None,
    ) -> KvClient:
        core = SyncKvClient(
            base_url,
            token,
            timeout_s=timeout_s,
            concurrency=concurrency,
            source=source,
            backend=backend,
        )
        return cls(core)

    def __repr__(self) -> str:
        return f"KvClient({self.core.base_url!r})"

    @property
    def base_url(self) -> str:
        return self.core.base_url

    def counters(self) -> ClientCounters:
        return self.core.counters()

    async def get(self, key: str) -> Outcome[bytes]:
        """Read one block: `Hit(bytes)`, `Miss()`, or `Unavailable(reason)`."""
        deadline = self.core.deadline()
        paths = await self._paths([key], deadline)
        return paths if isinstance(paths, Unavailable) else await self._get(paths[0], deadline)

    async def put(self, key: str, value: bytes) -> PutOutcome:
        """Store `value` under `key`; the engine keeps the first value ever stored there."""
        body = check_value(bytes(value))
        deadline = self.core.deadline(len(body))
        paths = await self._paths([key], deadline)
        if isinstance(paths, Unavailable):
            return paths
        return await self._put(paths[0], body, deadline)

    async def contains(self, key: str) -> PresenceOutcome:
        """HEAD the key: present or not, without transferring the value."""
        deadline = self.core.deadline()
        paths = await self._paths([key], deadline)
        if isinstance(paths, Unavailable):
            return paths
        return await self._contains(paths[0], deadline)

    async def exists(self, key: str) -> PresenceOutcome:
        """Ask the engine's `/kv/<key>/exists` route."""
        deadline = self.core.deadline()
        paths = await self._paths([check_exists_key(key)], deadline)
        if isinstance(paths, Unavailable):
            return paths
        response = await self._send("GET", paths[0] + EXISTS_ROUTE_SUFFIX, None, deadline)
        return self.core.read_exists(response)

    async def engine_stats(self) -> EngineStats | Unavailable:
        """The engine's own `/kv/stats`, normalized across backends."""
        return await self._engine_stats(self.core.deadline())

    async def stats(self) -> StatsOutcome:
        """Engine stats + this client's counters + derived ratios."""
        return self.core.report(await self.engine_stats())

    async def get_many(self, keys: Sequence[str]) -> list[Outcome[bytes]]:
        """Read many keys concurrently (bounded); results in input order."""
        deadline = self.core.deadline()
        paths = await self._paths(keys, deadline)
        if isinstance(paths, Unavailable):
            return [paths] * len(keys)
        return await self._gather(lambda path: self._get(path, deadline), paths, deadline)

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[PutOutcome]:
        """Store many (key, value) pairs concurrently (bounded); results in input order."""
        bodies = [check_value(bytes(value)) for _, value in items]
        deadline = self.core.deadline(sum(len(body) for body in bodies))
        paths = await self._paths([key for key, _ in items], deadline)
        if isinstance(paths, Unavailable):
            return [paths] * len(items)
        pairs = list(zip(paths, bodies, strict=True))
        return await self._gather(lambda pair: self._put(*pair, deadline), pairs, deadline)

    async def contains_many(self, keys: Sequence[str]) -> list[PresenceOutcome]:
        """HEAD many keys concurrently (bounded); results in input order."""
        deadline = self.core.deadline()
        paths = await self._paths(keys, deadline)
        if isinstance(paths, Unavailable):
            return [paths] * len(keys)
        return await self._gather(lambda path: self._contains(path, deadline), paths, deadline)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.core.close)

    async def _paths(self, keys: Sequence[str], deadline: Deadline) -> list[str] | Unavailable:
        """Request paths for `keys`, as `SyncKvClient._paths` (raises InvalidKey)."""
        checked = [check_key(key, backend=self.core.backend or "any") for key in keys]
        if self.core.needs_backend(checked):
            learned = await self._engine_stats(deadline)
            if isinstance(learned, Unavailable):
                return learned
        return self.core.paths_for(checked)

    async def _engine_stats(self, deadline: Deadline) -> EngineStats | Unavailable:
        return self.core.read_engine_stats(await self._send("GET", STATS_PATH, None, deadline))

    async def _get(self, path: str, deadline: Deadline) -> Outcome[bytes]:
        return self.core.read_get(await self._send("GET", path, None, deadline))

    async def _put(self, path: str, body: bytes, deadline: Deadline) -> PutOutcome:
        return self.core.read_put(await self._send("PUT", path, body, deadline), len(body))

    async def _contains(self, path: str, deadline: Deadline) -> PresenceOutcome:
        return self.core.read_contains(await self._send("HEAD", path, None, deadline))

    async def _send(
        self, method: str, path: str, body: bytes | None, deadline: Deadline
    ) -> WireResponse | Unavailable:
        pauses = retry_pauses()
        while True:
            if deadline.remaining_s() <= 0:
                return self.core.timed_out(deadline)
            try:
                return await self.core.wire.exchange_async(method, path, body, deadline=deadline)
            except WireError as exc:
                pause = self.core.retry_pause(exc, pauses, deadline)
                if pause < 0:
                    return self.core.give_up(exc)
                await anyio.sleep(pause)

    async def _gather(
        self, operation: Callable[[_T], Awaitable[R]], inputs: list[_T], deadline: Deadline
    ) -> list[R | Unavailable]:
        """`operation` over `inputs` on at most `concurrency` lanes of this call's own; inputs no
        lane reached by the deadline time out."""
        results: list[R | Unavailable | None] = [None] * len(inputs)
        pending = iter(range(len(inputs)))  # lanes share it: one event loop, no lock needed

        async def lane() -> None:
            for index in pending:
                results[index] = await operation(inputs[index])

        # Each exchange ends at the deadline by itself; the scope only guards against a stage
        # that does not (a worker thread on the TLS path), and then every open slot times out.
        with anyio.move_on_after(max(0.0, deadline.remaining_s()) + _LANE_GRACE_S):
            async with anyio.create_task_group() as group:
                for _ in range(min(self.core.concurrency, len(inputs))):
                    group.start_soon(lane)
        return [self.core.timed_out(deadline) if result is None else result for result in results]
