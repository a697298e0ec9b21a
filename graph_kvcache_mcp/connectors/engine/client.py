"""The engine's `/kv/<key>` surface: typed outcomes, batches with bounded concurrency.

`SyncKvClient` is the blocking client (LMCache's threads call it; batches fan out on a thread
pool). `KvClient` is what tools and services await: it sends on the event loop itself. Both read
responses through the same code. Keys are checked by `domain.engine.keys` before any I/O and
sent raw; values over the cap are refused unsent.

One deadline per call: every public method, a batch included, makes one `Deadline` of
`timeout_s` (plus upload time for request bodies, `domain.engine.limits.call_budget_s`) that
bounds all it does: connecting, sending, reading, waiting for a lane of its batch, and
retrying. Only a connection refused or reset before a byte was sent is retried; a timeout never
is. Each call fans out on lanes of its own (at most `concurrency` requests in flight per call)
and never waits behind another call's requests, so one caller stuck on a hung engine holds no
other caller past its own deadline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio
import anyio.to_thread
from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine.http_response import WireResponse
from graph_kvcache_mcp.connectors.engine.lanes import gather_lanes
from graph_kvcache_mcp.connectors.engine.reasons import EngineSource
from graph_kvcache_mcp.connectors.engine.replies import StatsOutcome
from graph_kvcache_mcp.connectors.engine.sync_client import (
    STATS_PATH,
    ReportedBackend,
    SyncKvClient,
    retry_pauses,
)
from graph_kvcache_mcp.connectors.engine.wire import Deadline, WireError
from graph_kvcache_mcp.domain.engine.keys import check_exists_key, check_key
from graph_kvcache_mcp.domain.engine.kv_stats import ClientCounters, EngineStats
from graph_kvcache_mcp.domain.engine.limits import EXISTS_ROUTE_SUFFIX, EngineBackend, check_value
from graph_kvcache_mcp.domain.outcomes import Outcome, PresenceOutcome, PutOutcome, Unavailable

__all__ = ["STATS_PATH", "KvClient", "ReportedBackend", "SyncKvClient", "retry_pauses"]

R = TypeVar("R")
_T = TypeVar("_T")


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
        return (await self.get_many([key]))[0]

    async def put(self, key: str, value: bytes) -> PutOutcome:
        """Store `value` under `key`; the engine keeps the first value ever stored there."""
        return (await self.put_many([(key, value)]))[0]

    async def contains(self, key: str) -> PresenceOutcome:
        """HEAD the key: present or not, without transferring the value."""
        return (await self.contains_many([key]))[0]

    async def exists(self, key: str) -> PresenceOutcome:
        """Ask the engine's `/kv/<key>/exists` route."""
        deadline = self.core.deadline()
        paths = await self._paths([check_exists_key(key)], deadline)
        if isinstance(paths, Unavailable):
            return paths
        response = await self._send("GET", paths[0] + EXISTS_ROUTE_SUFFIX, None, deadline)
        return self.core.replies.read_exists(response)

    async def engine_stats(self) -> EngineStats | Unavailable:
        """The engine's own `/kv/stats`, normalized across backends."""
        return await self._engine_stats(self.core.deadline())

    async def stats(self) -> StatsOutcome:
        """Engine stats + this client's counters + derived ratios."""
        return self.core.replies.report(await self.engine_stats())

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
        return self.core.learn(await self._send("GET", STATS_PATH, None, deadline))

    async def _get(self, path: str, deadline: Deadline) -> Outcome[bytes]:
        return self.core.replies.read_get(await self._send("GET", path, None, deadline))

    async def _put(self, path: str, body: bytes, deadline: Deadline) -> PutOutcome:
        return self.core.replies.read_put(await self._send("PUT", path, body, deadline), len(body))

    async def _contains(self, path: str, deadline: Deadline) -> PresenceOutcome:
        return self.core.replies.read_contains(await self._send("HEAD", path, None, deadline))

    async def _send(
        self, method: str, path: str, body: bytes | None, deadline: Deadline
    ) -> WireResponse | Unavailable:
        pauses = retry_pauses()
        while True:
            if deadline.remaining_s() <= 0:
                return self.core.timed_out(deadline)
            wire = self.core.current_wire()
            if isinstance(wire, Unavailable):
                return wire
            try:
                return await wire.exchange_async(method, path, body, deadline=deadline)
            except WireError as exc:
                self.core.wire_failed(wire, exc)
                pause = self.core.retry_pause(exc, pauses, deadline)
                if pause < 0:
                    return self.core.replies.give_up(exc)
                await anyio.sleep(pause)

    async def _gather(
        self, operation: Callable[[_T], Awaitable[R]], inputs: list[_T], deadline: Deadline
    ) -> list[R | Unavailable]:
        return await gather_lanes(
            operation,
            inputs,
            lanes=self.core.concurrency,
            deadline=deadline,
            timed_out=self.core.timed_out,
        )
