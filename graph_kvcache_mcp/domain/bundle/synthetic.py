"""Synthetic evidence for measurements and benchmarks. Pure and deterministic per seed.

Items read like short findings about a caching stack, with sources, confidences, dates and a few
relations, so every part of a compile (lexical relevance, MMR, budget, proof graph) has work to do.
A seed (e.g. a per-run nonce) is folded into every text: a new seed gives new content, new keys
and new token sequences, so a run never starts warm from an earlier one.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from graph_kvcache_mcp.domain.bundle.models import EvidenceItem, Relation

_SUBJECTS = (
    "the prefix cache",
    "block hashing",
    "the KV offload tier",
    "chunked prefill",
    "the eviction policy",
    "the tokenizer",
    "the scheduler",
    "the content-addressed store",
    "the remote backend",
    "the chat template",
)
_VERBS = ("reuses", "drops", "hashes", "splits", "stores", "reloads", "pins", "evicts")
_OBJECTS = (
    "whole blocks of tokens",
    "the shared system prompt",
    "tool definitions",
    "earlier turns",
    "retrieved documents",
    "partial blocks",
    "cold requests",
    "warm requests",
)
_KINDS = ("claim", "observation", "measurement", "document")
_BASE_DATE = datetime(2025, 1, 1, tzinfo=UTC)
QUERY = "how does the prefix cache reuse blocks of the shared system prompt"


def synthetic_evidence(count: int, *, seed: str, sentences: int = 3) -> list[EvidenceItem]:
    """`count` items whose texts all carry `seed`; equal arguments give equal items."""
    rng = random.Random(f"bundle-evidence/{seed}")
    items: list[EvidenceItem] = []
    for index in range(count):
        body = " ".join(
            f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
            f"in {rng.randint(2, 64)} of {rng.randint(64, 512)} cases."
            for _ in range(sentences)
        )
        relations: list[Relation] = []
        if index and rng.random() < 0.3:
            relations.append(
                Relation(
                    type=rng.choice(("supports", "contradicts", "alternative_to")),
                    target=f"item-{rng.randrange(index):04d}",
                )
            )
        items.append(
            EvidenceItem(
                id=f"item-{index:04d}",
                text=f"[{seed}] {body}",
                kind=rng.choice(_KINDS),
                source_refs=tuple(f"source-{rng.randint(1, 99)}" for _ in range(rng.randint(0, 2))),
                confidence=round(rng.uniform(0.3, 1.0), 2),
                observed_at=_BASE_DATE + timedelta(days=rng.randint(0, 365)),
                relations=tuple(relations),
            )
        )
    return items
