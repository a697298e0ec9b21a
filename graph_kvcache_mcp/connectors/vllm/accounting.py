"""A call's cached tokens: from the answer's usage, else from vLLM's /metrics around the call.

The meter learns whether the server reports cached tokens in its answers
(`--enable-prompt-tokens-details`) and whether it runs a KV connector (an external tier), and reads
/metrics around a call while answers do not report cached tokens, or while there is a tier split
to measure: the answer's count is local plus external, and only /metrics tells them apart.
vLLM publishes a request's stats a moment after it answers, so the snapshot after a call is
polled until `vllm:prompt_tokens_total` has moved by at least the call's prompt tokens, or
`SETTLE_S` has passed. Chat and the bundle reuse measurement both use this one wait;
`domain.vllm.chat` decides what the window may be credited with.

Reads cost what an agent waits for (a scrape of vLLM's /metrics takes it tens of ms on a busy
host), so a call reads as little as it can, and in parallel: the counters read after one call
are the next call's "before" (the window check still proves that only that call moved them; any
request in between makes the split unknown, never wrong), and vLLM's and the lmcache server's
counters are read at the same time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from graph_kvcache_mcp.connectors.vllm.metrics import VllmMetricsClient
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters, counters_moved
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.chat import (
    CachedTokens,
    MetricsWindow,
    from_usage,
    from_window,
    metrics_window,
    split_by_tier,
    unattributed,
)
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot, UnknownModel

SETTLE_S = 5.0  # the longest wait for /metrics to show a call that already returned
POLL_S = 0.02


class TierCounters(Protocol):
    """The counters of the lmcache server behind vLLM's MP connector (set by whoever knows
    which server that is: `connectors.stack`)."""

    async def read(self) -> LmcacheCounters | Unavailable | None:
        """Its lookup counters now; None when vLLM uses no lmcache server we know."""
        ...

    async def aclose(self) -> None:
        """Close what reading kept open (the meter's client closes it with itself)."""
        ...


@dataclass(frozen=True)
class CallStart:
    """What was read before a call: vLLM's counters and the lmcache server's."""

    vllm: MetricsSnapshot | None
    lmcache: LmcacheCounters | Unavailable | None = None


class CacheMeter:
    """Snapshots of one server's /metrics for one model, and the window around a call."""

    def __init__(
        self, metrics: VllmMetricsClient, *, fallback: bool = True, settle_s: float = SETTLE_S
    ) -> None:
        self.metrics = metrics
        self.fallback = fallback
        self.settle_s = settle_s
        self.usage_reports_cached: bool | None = None  # learned from the answers
        self.external_tier: bool | None = None  # learned from /metrics windows
        self.tier: TierCounters | None = None
        """The lmcache server behind vLLM, whose counters split the external hit into L1/L2."""
        self._last: dict[str, CallStart] = {}
        """Per model, the counters read after the last call: the next call's start."""

    async def before_call(self, model: str) -> CallStart:
        """A snapshot to diff against later (while the /metrics fallback is on), unless answers
        report cached tokens themselves and the server is known to have no external tier: the
        one read after the last call when there is one, else both servers' counters now."""
        if not self.fallback or (self.usage_reports_cached and self.external_tier is False):
            return CallStart(None)
        last = self._last.pop(model, None)
        if last is not None:
            return last
        vllm, lmcache = await self._read_both(lambda: self.snapshot(model))
        return CallStart(vllm, lmcache)

    async def _read_both(
        self, vllm: Callable[[], Awaitable[MetricsSnapshot | None]]
    ) -> tuple[MetricsSnapshot | None, LmcacheCounters | Unavailable | None]:
        """vLLM's counters (as `vllm` reads them) and the lmcache server's, read concurrently."""
        lmcache: list[LmcacheCounters | Unavailable | None] = [None]

        async def read_tier() -> None:
            if self.tier is not None:
                lmcache[0] = await self.tier.read()

        async with anyio.create_task_group() as group:
            group.start_soon(read_tier)
            snapshot = await vllm()
        return snapshot, lmcache[0]

    async def credit(
        self,
        model: str,
        *,
        prompt_tokens: int,
        reported: int | None,
        answered_usage: bool,
        start: CallStart,
    ) -> CachedTokens:
        """The call's cached tokens: `reported` by the answer, else the /metrics window from
        `start`, else unknown with the reason."""
        before = start.vllm
        if reported is not None:
            self.usage_reports_cached = True
            cached = from_usage(reported)
            if before is None:
                return cached
            window, moved = await self._window_and_tier(model, before, prompt_tokens, start)
            if window is None:
                return cached
            return split_by_tier(cached, window, prompt_tokens, moved)
        self.usage_reports_cached = False
        if not answered_usage:
            return unattributed("the response carried no usage block")
        if before is None:
            why = "disabled" if not self.fallback else "not readable before the call"
            return unattributed(
                "vLLM left usage.prompt_tokens_details empty (start it with "
                f"--enable-prompt-tokens-details) and /metrics was {why}"
            )
        window, moved = await self._window_and_tier(model, before, prompt_tokens, start)
        if window is None:
            return unattributed("/metrics could not be read after the call")
        return from_window(window, prompt_tokens, moved)

    async def _window_and_tier(
        self, model: str, before: MetricsSnapshot, prompt_tokens: int, start: CallStart
    ) -> tuple[MetricsWindow | None, LmcacheCounters | Unavailable | None]:
        """vLLM's window since `before` and what the lmcache server's counters did since
        `start` (None without a server), read concurrently; kept as the next call's start."""
        after, tier_after = await self._read_both(
            lambda: self.settled(model, before, prompt_tokens)
        )
        if after is None:
            return None, None
        window = metrics_window(before, after)
        self.external_tier = window.external_tier
        self._last[model] = CallStart(after, tier_after)
        if self.tier is None or start.lmcache is None or tier_after is None:
            return window, None
        if isinstance(start.lmcache, Unavailable):
            return window, start.lmcache
        if isinstance(tier_after, Unavailable):
            return window, tier_after
        return window, counters_moved(start.lmcache, tier_after)

    def __repr__(self) -> str:
        return f"CacheMeter({self.metrics.metrics_url!r})"

    async def snapshot(self, model: str) -> MetricsSnapshot | None:
        """The model's counters now; None when /metrics cannot be read or lacks the model."""
        try:
            snapshot = await self.metrics.snapshot(model)
        except UnknownModel:
            return None
        return None if isinstance(snapshot, Unavailable) else snapshot

    async def settled(
        self, model: str, before: MetricsSnapshot, prompt_tokens: int
    ) -> MetricsSnapshot | None:
        """The first snapshot that counts a call of `prompt_tokens`; the last one seen when the
        counters do not get there within `settle_s` (the window then says so)."""
        after: MetricsSnapshot | None = None
        with anyio.move_on_after(self.settle_s):
            while True:
                after = await self.snapshot(model)
                if after is None:
                    break
                moved = metrics_window(before, after).prompt_tokens
                if moved is None or moved >= prompt_tokens:
                    break
                await anyio.sleep(POLL_S)  # a condition poll, bounded by move_on_after
        return after

    async def window(
        self, model: str, before: MetricsSnapshot, prompt_tokens: int
    ) -> MetricsWindow | None:
        """What the counters did from `before` until they show the call; None when unreadable."""
        after = await self.settled(model, before, prompt_tokens)
        if after is None:
            return None
        window = metrics_window(before, after)
        self.external_tier = window.external_tier
        return window
