"""What the connector's reads (`store`) and uploads (`uploads`) share: the pause after a failure,
the transfer tally, and running one kind of call on many inputs under one deadline.

After a failure every engine call stays quiet for `QUIET_AFTER_FAILURE_S` (answers "miss" at
once) rather than making every request wait for a dead engine; the first failure of an outage is
logged, the rest are not. Imports only the standard library and the package's outcomes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from graph_kvcache_mcp.domain.outcomes import Unavailable

# Under "vllm." so that vLLM's own logging configuration prints it beside vLLM's lines.
LOGGER_NAME = "vllm.graph_kvcache.engine_kv"
QUIET_AFTER_FAILURE_S = 10.0

logger = logging.getLogger(LOGGER_NAME)
_T = TypeVar("_T")
_R = TypeVar("_R")


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


class OutagePause:
    """Engine calls answer "miss" at once for a while after one failed."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._quiet_until = 0.0

    def quiet(self) -> bool:
        return time.monotonic() < self._quiet_until

    def went_wrong(self, what: str, reason: str) -> None:
        with self._lock:
            first = not self.quiet()
            self._quiet_until = time.monotonic() + QUIET_AFTER_FAILURE_S
        if first:  # once per outage, not once per request
            logger.warning(
                "engine KV %s failed, treated as a miss (vLLM recomputes); engine calls paused "
                "for %g s: %s",
                what,
                QUIET_AFTER_FAILURE_S,
                reason,
            )

    def run_all(
        self,
        pool: ThreadPoolExecutor,
        operation: Callable[[_T], _R],
        inputs: Sequence[_T],
        deadline: float,
        what: str,
    ) -> list[_R | None]:
        """`operation` on every input concurrently on `pool`; None for each one not answered by
        `deadline` (a monotonic time). Nothing is called while the pause lasts."""
        if not inputs or self.quiet():
            return [None] * len(inputs)
        futures: list[Future[_R]] = [pool.submit(operation, item) for item in inputs]
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
            self.went_wrong(what, f"no answer within {self.timeout_s:g} s")
        elif failure := next((r for r in results if isinstance(r, Unavailable)), None):
            self.went_wrong(what, failure.reason)
        elif any(future.exception() is not None for future in futures):
            self.went_wrong(what, "the client raised")
        return results
