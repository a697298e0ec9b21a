"""Exact token counts for the bundle budget, from the served model's tokenizer (vLLM `/tokenize`).

vLLM's `/tokenize` adds the model's special tokens (a BOS for Llama-style models) to every text;
a part inside a bundle never gets them, so the count of the empty text is subtracted from each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import VllmRequestError

if TYPE_CHECKING:
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient

CONCURRENCY = 8


async def token_counter_for(
    client: VllmClient, model: str | None
) -> VllmTokenCounter | Unavailable:
    """The tokenizer of `model` (or of the server's only model), or why it cannot be had.

    Raises:
        VllmRequestError: no model given and the server serves several.
    """
    chosen = await client.resolve_model(model)
    return chosen if isinstance(chosen, Unavailable) else VllmTokenCounter(client, chosen)


class VllmTokenCounter:
    """Counts parts with one model's tokenizer; `name` (in every bundle key) names the model."""

    def __init__(self, client: VllmClient, model: str) -> None:
        self.client = client
        self.model = model
        self.name = f"vllm-tokenize/{model}"
        self._limiter = anyio.CapacityLimiter(CONCURRENCY)

    def __repr__(self) -> str:
        return f"VllmTokenCounter({self.client.root_url!r}, {self.model!r})"

    async def count_many(self, texts: Sequence[str]) -> list[int] | Unavailable:
        """One count per text, or `Unavailable` (with vLLM's reason) when any count fails."""
        baseline = await self._count("")
        if isinstance(baseline, Unavailable):
            return baseline
        counts: list[int] = [0] * len(texts)
        failure: list[Unavailable] = []

        async def one(index: int, text: str) -> None:
            async with self._limiter:
                if failure:
                    return
                counted = await self._count(text)
            if isinstance(counted, Unavailable):
                failure.append(counted)
            else:
                counts[index] = max(0, counted - baseline)

        async with anyio.create_task_group() as group:
            for index, text in enumerate(texts):
                group.start_soon(one, index, text)
        return failure[0] if failure else counts

    async def _count(self, text: str) -> int | Unavailable:
        try:
            return await self.client.tokenize(text, model=self.model)
        except VllmRequestError as exc:
            return Unavailable(f"vLLM refused to tokenize for {self.model!r}: {exc}", exc.status)
