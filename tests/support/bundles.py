"""Evidence builders shared by the bundle tests (unit, integration, tools)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graph_kvcache_mcp.domain.bundle import BundleParams, BundleRequest, EvidenceItem


class CharCounter:
    """One token per character: additive, so sums of parts equal the whole text exactly."""

    name = "test/chars"

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [len(text) for text in texts]


def item(item_id: str, text: str = "", **fields: Any) -> EvidenceItem:
    return EvidenceItem(id=item_id, text=text or f"evidence {item_id}", **fields)


def request(items: Sequence[EvidenceItem], query: str = "", **params: Any) -> BundleRequest:
    return BundleRequest(query=query, items=tuple(items), params=BundleParams(**params))


def corpus(count: int, *, nonce: str = "") -> list[EvidenceItem]:
    """`count` distinct, related items about caching (sources, confidences, dates, relations)."""
    topics = ("prefix cache", "block hash", "kv offload", "chunk size", "eviction", "tokenizer")
    items = []
    for n in range(count):
        topic = topics[n % len(topics)]
        items.append(
            EvidenceItem(
                id=f"ev-{n:04d}",
                text=f"{nonce}Finding {n}: the {topic} behaves as measured in run {n * 7 % 13}; "
                f"blocks of {16 * (1 + n % 4)} tokens are reused when the {topic} is warm.",
                kind=("claim", "observation", "document")[n % 3],
                source_refs=tuple(f"doc-{n}-{r}" for r in range(n % 3)),
                confidence=None if n % 5 == 0 else (n % 10) / 10,
                observed_at=f"2025-0{1 + n % 9}-1{n % 10}T08:00:00Z",
                relations=(
                    ({"type": "supports", "target": f"ev-{n + 1:04d}"},) if n % 4 == 0 else ()
                )
                + (({"type": "contradicts", "target": f"ev-{n - 3:04d}"},) if n % 7 == 3 else ()),
            )
        )
    return items
