"""Which of vLLM's cache tiers an `EngineKVConnector` hit came from. Pure: no I/O.

vLLM (0.32 and 0.33 alike: `KVConnectorBase_V1.get_external_cache_hit_sources`, `CacheHitSource`)
asks a connector, after each admission, to split its external hit tokens by tier, and counts them
in `vllm:prompt_tokens_cached_by_source_total{source=...}`. A connector that does not answer is
counted as `external_unspecified`. The engine is one tier whose medium its backend decides:
"""

from __future__ import annotations

from typing import Literal

HitSource = Literal["host", "disk", "external_unspecified"]
"""The `CacheHitSource` values an engine hit can take (vLLM's own strings)."""

ENGINE_HIT_SOURCE: dict[str, HitSource] = {"durable": "disk", "memory": "host"}
"""The durable backend serves its blocks from disk (and its page cache); the memory backend
from another process's RAM on this machine."""


def engine_hit_source(backend: str | None, *, engine_on_loopback: bool) -> HitSource:
    """The tier of a hit served by an engine of `backend` ("memory", "durable"; None: it has not
    said). A memory engine on another host is a remote store, which vLLM labels
    external_unspecified; a durable one still reads from disk."""
    source = ENGINE_HIT_SOURCE.get(backend or "", "external_unspecified")
    if source == "host" and not engine_on_loopback:
        return "external_unspecified"
    return source
