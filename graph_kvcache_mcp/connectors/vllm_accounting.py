"""Read vLLM's /metrics around one call: a snapshot before, the first one after that shows it.

vLLM publishes a request's stats a moment after it answers, so the snapshot after a call is
polled until `vllm:prompt_tokens_total` has moved by at least the call's prompt tokens, or
`SETTLE_S` has passed. Chat (when usage carries no cached tokens) and the bundle reuse
measurement both use this one wait; `domain.vllm_chat` decides what the window may be credited with.
"""

from __future__ import annotations

import anyio

from graph_kvcache_mcp.connectors.vllm_metrics import VllmMetricsClient
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm_chat import MetricsWindow, metrics_window
from graph_kvcache_mcp.domain.vllm_metrics import MetricsSnapshot, UnknownModel

SETTLE_S = 5.0  # the longest wait for /metrics to show a call that already returned
POLL_S = 0.02


class CacheMeter:
    """Snapshots of one server's /metrics for one model, and the window around a call."""

    def __init__(self, metrics: VllmMetricsClient, *, settle_s: float = SETTLE_S) -> None:
        self.metrics = metrics
        self.settle_s = settle_s

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
        return None if after is None else metrics_window(before, after)
