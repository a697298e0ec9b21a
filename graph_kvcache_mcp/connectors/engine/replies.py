"""Reading the engine's answers into typed outcomes, and the client's running counters.

Shared by both faces of the KV client (`SyncKvClient` and `KvClient`), so they cannot drift apart.
Pure of I/O: it reads responses the wire already received, or the faults that stood in for them.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TypeAlias

from graph_kvcache_mcp.connectors.engine.http_response import WireResponse
from graph_kvcache_mcp.connectors.engine.reasons import EngineSource, explain_fault, explain_status
from graph_kvcache_mcp.connectors.engine.wire import WireError
from graph_kvcache_mcp.domain.engine.kv_stats import (
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

StatsOutcome: TypeAlias = KvStatsReport | Unavailable


class Counters:
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


class KvReplies:
    """What each answer of one engine means; counts as it reads. Thread-safe."""

    def __init__(
        self,
        url: str,
        source: EngineSource,
        *,
        token_given: bool,
        token_file: Path | None = None,
    ) -> None:
        self.url = url
        self.source = source
        self.token_given = token_given
        self.token_file = token_file
        self.counters = Counters()

    def read_get(self, response: WireResponse | Unavailable) -> Outcome[bytes]:
        if isinstance(response, Unavailable):
            return response
        if response.status == 200:
            self.counters.add(gets=1, get_hits=1, bytes_read=len(response.body))
            return Hit(response.body)
        if response.status == 404:
            self.counters.add(gets=1, get_misses=1)
            return Miss()
        return self._unexpected(response)

    def read_get_into(self, response: WireResponse | Unavailable) -> Outcome[int]:
        """`read_get` for a body received into a sink: `Hit(bytes received)`."""
        if isinstance(response, Unavailable):
            return response
        if response.status == 200:
            size = response.sunk_bytes or len(response.body)
            self.counters.add(gets=1, get_hits=1, bytes_read=size)
            return Hit(size)
        if response.status == 404:
            self.counters.add(gets=1, get_misses=1)
            return Miss()
        return self._unexpected(response)

    def read_put(self, response: WireResponse | Unavailable, size: int) -> PutOutcome:
        if isinstance(response, Unavailable):
            return response
        if response.status in (200, 201):
            new = response.status == 201
            self.counters.add(
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
            self.counters.add(contains_checks=1)
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
        self.counters.add(contains_checks=1)
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
        return build_report(engine, self.counters.snapshot())

    def give_up(self, exc: WireError) -> Unavailable:
        """The `Unavailable` for a request whose every attempt failed."""
        return self._fail(explain_fault(exc, self.url, self.source), None)

    def refuse(self, reason: str) -> Unavailable:
        """The `Unavailable` for a request that was not sent (`reason` says why)."""
        return self._fail(reason, None)

    def _unexpected(self, response: WireResponse) -> Unavailable:
        reason = explain_status(response, self.url, self.token_given, self.token_file)
        return self._fail(reason, response.status)

    def _fail(self, reason: str, status: int | None) -> Unavailable:
        self.counters.add(errors=1)
        return Unavailable(reason, status)
