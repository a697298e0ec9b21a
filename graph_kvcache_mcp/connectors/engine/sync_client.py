"""The blocking `/kv/<key>` client: the core that `KvClient` is built on.

`SyncKvClient` is what LMCache's threads call (batches fan out on a thread pool of its own). It
owns the wire, the key checks, the retry rule and the reading of every response, so the async
face in `client.py` shares them and cannot drift. One deadline per call, as `client.py` says.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Protocol, TypeAlias, TypeVar

from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine.http_response import BodySink, WireResponse
from graph_kvcache_mcp.connectors.engine.lanes import run_lanes
from graph_kvcache_mcp.connectors.engine.reasons import EngineSource
from graph_kvcache_mcp.connectors.engine.replies import KvReplies, StatsOutcome
from graph_kvcache_mcp.connectors.engine.wire import (
    Deadline,
    EngineWire,
    WireError,
    WireTimeout,
    WireUnsent,
)
from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls
from graph_kvcache_mcp.domain.endpoints import HttpEndpoint, parse_http_url
from graph_kvcache_mcp.domain.engine.keys import check_exists_key, check_key, key_limit
from graph_kvcache_mcp.domain.engine.kv_stats import (
    ClientCounters,
    EngineStats,
)
from graph_kvcache_mcp.domain.engine.limits import (
    EXISTS_ROUTE_SUFFIX,
    KEY_BYTES_ANY_BACKEND,
    KV_ROUTE_PREFIX,
    EngineBackend,
    call_budget_s,
    check_value,
)
from graph_kvcache_mcp.domain.outcomes import (
    Outcome,
    PresenceOutcome,
    PutOutcome,
    Unavailable,
)

_BACKOFF_S = (0.05, 0.15)
"""A request that never left (connection refused or reset before a byte went out) is sent again
after these pauses, while the call's deadline allows."""

_POOL_LANES_PER_SLOT = 4
"""The sync client's thread pool holds this many lanes per unit of `concurrency`, so that a few
batches stuck on a hung engine leave threads for everyone else."""

ReportedBackend: TypeAlias = EngineBackend | Literal["unknown"]
R = TypeVar("R")
_T = TypeVar("_T")


class WireProof(Protocol):
    """Where a child process gets its wire when the engine must be proved first
    (`children.proof.ManagedEngineProof`)."""

    def wire(self) -> EngineWire | str:
        """The proved engine's wire, or why no request may be sent now."""
        ...

    def forget(self, wire: EngineWire) -> None:
        """`wire`'s connection failed: prove the engine again before the next request."""
        ...


class SyncKvClient:
    """Blocking client for one engine; safe to share between threads.

    Also the shared core of `KvClient`: it owns the wire, the key checks and the reading of every
    response (`replies`, with the counters), so the two faces cannot drift apart.
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
        proof: WireProof | None = None,
        token_file: Path | None = None,
        lane_setup: Callable[[], None] | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.endpoint: HttpEndpoint = parse_http_url(base_url, what="KV base URL")
        self.source = source
        self.backend: ReportedBackend | None = backend
        """The engine's backend, whose key limit applies: given (a managed engine's state knows
        it), else learned from the first `/kv/stats` answer; None until then."""
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.wire = EngineWire(self.endpoint, token, tls=tls)
        self.proof = proof
        """With a proof every request goes through the wire it hands out (never `wire`)."""
        self.replies = KvReplies(
            self.endpoint.url, source, token_given=token is not None, token_file=token_file
        )
        self.lane_setup = lane_setup
        """Run by each batch lane's thread as it starts (vLLM's connector says where it may run);
        set it before the first batch."""
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SyncKvClient({self.endpoint.url!r})"

    @property
    def base_url(self) -> str:
        return self.endpoint.url

    def counters(self) -> ClientCounters:
        return self.replies.counters.snapshot()

    # --- single operations -------------------------------------------------------------------

    def deadline(self, body_bytes: int = 0) -> Deadline:
        """The deadline of a call starting now that sends `body_bytes` of request bodies."""
        return Deadline.after(call_budget_s(self.timeout_s, body_bytes))

    def get(self, key: str) -> Outcome[bytes]:
        """Read one block: `Hit(bytes)`, `Miss()`, or `Unavailable(reason)`."""
        return self.get_many([key])[0]

    def put(self, key: str, value: bytes) -> PutOutcome:
        """Store `value` under `key`; the engine keeps the first value ever stored there."""
        return self.put_many([(key, value)])[0]

    def contains(self, key: str) -> PresenceOutcome:
        """HEAD the key: present or not, without transferring the value."""
        return self.contains_many([key])[0]

    def exists(self, key: str) -> PresenceOutcome:
        """Ask the engine's `/kv/<key>/exists` route (JSON answer; same meaning as `contains`)."""
        deadline = self.deadline()
        paths = self._paths([check_exists_key(key)], deadline)
        if isinstance(paths, Unavailable):
            return paths
        return self.replies.read_exists(
            self._send("GET", paths[0] + EXISTS_ROUTE_SUFFIX, None, deadline)
        )

    def engine_stats(self) -> EngineStats | Unavailable:
        """The engine's own `/kv/stats`, normalized across backends."""
        return self._engine_stats(self.deadline())

    def stats(self) -> StatsOutcome:
        """Engine stats + this client's counters + derived ratios."""
        return self.replies.report(self.engine_stats())

    # --- batches -----------------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> list[Outcome[bytes]]:
        """Read many keys concurrently; results in input order, each typed on its own."""
        deadline = self.deadline()
        paths = self._paths(keys, deadline)
        if isinstance(paths, Unavailable):
            return [paths] * len(keys)
        return self._fan_out(lambda path: self._get(path, deadline), paths, deadline)

    def get_many_into(
        self, keys: Sequence[str], sinks: Sequence[BodySink], *, expect_bytes: int = 0
    ) -> list[Outcome[int]]:
        """`get_many`, each value received straight into its sink (`Hit(bytes received)`).

        `expect_bytes` (the values' sizes, when the caller knows them) extends the call's
        deadline as request bodies do for puts, so that a batch of large values is not cut off
        mid-download. A sink whose answer is not a `Hit` holds nothing usable. A sink's buffers
        may still be written to shortly after a batch that timed out returns: reuse them only
        after a batch with no `Unavailable` answer.
        """
        deadline = self.deadline(expect_bytes)
        paths = self._paths(keys, deadline)
        if isinstance(paths, Unavailable):
            return [paths] * len(keys)
        pairs = list(zip(paths, sinks, strict=True))
        return self._fan_out(lambda pair: self._get_into(*pair, deadline), pairs, deadline)

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

    def learn(self, response: WireResponse | Unavailable) -> EngineStats | Unavailable:
        """Read a `/kv/stats` answer, and remember the backend it names (its key limit applies)."""
        stats = self.replies.read_engine_stats(response)
        if not isinstance(stats, Unavailable):
            self.backend = stats.backend
        return stats

    def retry_pause(self, exc: WireError, pauses: Iterator[float], deadline: Deadline) -> float:
        """How long to pause before sending again after `exc`, or -1 to give up.

        Only a request that never left is sent again, and only when the pause leaves time to.
        """
        if not isinstance(exc, WireUnsent):
            return -1.0
        pause = next(pauses, None)
        if pause is None or pause >= deadline.remaining_s():
            return -1.0
        self.replies.counters.add(retries=1)
        return pause

    def needs_backend(self, keys: list[str]) -> bool:
        """Whether checking `keys` must wait for the engine to say its backend (a key longer than
        every backend stores, while the backend is not known yet)."""
        return self.backend is None and any(len(key) > KEY_BYTES_ANY_BACKEND for key in keys)

    def paths_for(self, keys: list[str]) -> list[str]:
        """Request paths for keys already checked against the rules every backend shares, now
        against the engine's own key limit (raises InvalidKey, naming the backend)."""
        backend = self.backend or "unknown"
        limit = key_limit(backend)  # the other rules held already: only the length is left
        return [
            KV_ROUTE_PREFIX + (key if len(key) <= limit else check_key(key, backend=backend))
            for key in keys
        ]

    def current_wire(self) -> EngineWire | Unavailable:
        """The wire for the next request: the proof's when there is one (or why none is sent)."""
        if self.proof is None:
            return self.wire
        wire = self.proof.wire()
        return self.replies.refuse(wire) if isinstance(wire, str) else wire

    def wire_failed(self, wire: EngineWire, exc: WireError) -> None:
        """A request on `wire` failed: a connection failure makes the proof be made again (a
        timeout does not: the engine is slow, not gone)."""
        if self.proof is not None and not isinstance(exc, WireTimeout):
            self.proof.forget(wire)

    def timed_out(self, deadline: Deadline) -> Unavailable:
        """The answer for a request the call's deadline left no time to start."""
        return self.replies.give_up(WireTimeout("queue", deadline.budget_s))

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
        return self.learn(self._send("GET", STATS_PATH, None, deadline))

    def _get(self, path: str, deadline: Deadline) -> Outcome[bytes]:
        return self.replies.read_get(self._send("GET", path, None, deadline))

    def _get_into(self, path: str, sink: BodySink, deadline: Deadline) -> Outcome[int]:
        return self.replies.read_get_into(self._send("GET", path, None, deadline, sink))

    def _put(self, path: str, body: bytes, deadline: Deadline) -> PutOutcome:
        return self.replies.read_put(self._send("PUT", path, body, deadline), len(body))

    def _contains(self, path: str, deadline: Deadline) -> PresenceOutcome:
        return self.replies.read_contains(self._send("HEAD", path, None, deadline))

    def _fan_out(
        self, operation: Callable[[_T], R], inputs: list[_T], deadline: Deadline
    ) -> list[R | Unavailable]:
        return run_lanes(
            self._lane_pool(),
            operation,
            inputs,
            lanes=self.concurrency,
            deadline=deadline,
            timed_out=self.timed_out,
        )

    def _lane_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.concurrency * _POOL_LANES_PER_SLOT,
                    thread_name_prefix="kv-lane",
                    initializer=self.lane_setup,
                )
            return self._pool

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        deadline: Deadline,
        sink: BodySink | None = None,
    ) -> WireResponse | Unavailable:
        pauses = retry_pauses()
        while True:
            if deadline.remaining_s() <= 0:
                return self.timed_out(deadline)
            wire = self.current_wire()
            if isinstance(wire, Unavailable):
                return wire
            try:
                return wire.exchange(method, path, body, deadline=deadline, sink=sink)
            except WireError as exc:
                self.wire_failed(wire, exc)
                pause = self.retry_pause(exc, pauses, deadline)
                if pause < 0:
                    return self.replies.give_up(exc)
                time.sleep(pause)


STATS_PATH = KV_ROUTE_PREFIX + "stats"


def retry_pauses() -> Iterator[float]:
    """Jittered pauses before each resend of a request that never left."""
    return iter(pause * (0.5 + random.random()) for pause in _BACKOFF_S)
