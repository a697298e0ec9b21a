"""The facts that explain a prompt's miss per tier (`TierFacts`): the `lmcache server` counters
that explain misses, parsed from its `/metrics`, and what the coordinator's directory says about
the prompt's chunks. Pure: parses, no I/O.

Counter names are LMCache 0.5.6's OpenTelemetry names as its Prometheus exporter writes them
(`lmcache_mp.l1_evicted`, unit chunks -> `lmcache_mp_l1_evicted_chunks_total`); they are matched
by their stem so a unit suffix that changes does not hide them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.fleet.tiers import TierHeld
from graph_kvcache_mcp.domain.lmcache.chunk_keys import SEED_FREE_HASH
from graph_kvcache_mcp.domain.lmcache.metrics import PREFIX


class ServerCounters(BaseModel):
    """The lmcache server's counters that explain misses (totals since it started)."""

    model_config = ConfigDict(frozen=True)

    early_exits: dict[str, int] = Field(default_factory=dict)
    l1_evicted_chunks: int = 0
    l1_allocation_failures: int = 0
    l2_store_submitted_chunks: int = 0
    l2_store_completed_chunks: int = 0
    l2_prefetch_failures: int = 0


class DirectoryFacts(BaseModel):
    """What the coordinator's directory says about this prompt's chunks."""

    model_config = ConfigDict(frozen=True)

    chunks: int = Field(description="Whole chunks the coordinator cut the prompt into.")
    chunk_hashes: list[str] = Field(default_factory=list, description="Its hash of each chunk.")
    l1_elsewhere: list[str] = Field(
        default_factory=list, description="Other servers holding the first chunk in L1."
    )
    l2_by_gone: bool = Field(
        False, description="The first chunk's L2 placement names a server no longer registered."
    )


class TierFacts(BaseModel):
    """Everything the rules read for one prompt on one instance."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int
    block_size: int | None
    chunk_size: int
    hash_algorithm: str = SEED_FREE_HASH
    tiers: Mapping[str, TierHeld]
    vllm_counted_prompt_tokens: int | None = Field(
        None, description="Prompt tokens this vLLM process counted since it started."
    )
    vllm_feed_resets: int = 0
    vllm_kv_usage: float | None = None
    counters: ServerCounters | None = None
    directory: DirectoryFacts | None = None
    hash_seeds: dict[str, str | None] = Field(
        default_factory=dict,
        description="PYTHONHASHSEED of the processes we could read (vllm, server); None: unset.",
    )
    expected_hashes: list[str] | None = Field(
        None, description="The prompt's chunk hashes as the server computes them (blake3 only)."
    )


_STEMS = {
    "lmcache_mp_l1_evicted": "l1_evicted_chunks",
    "lmcache_mp_l1_allocation_failure": "l1_allocation_failures",
    "lmcache_mp_l2_store_submitted_objects": "l2_store_submitted_chunks",
    "lmcache_mp_l2_store_completed_objects": "l2_store_completed_chunks",
    "lmcache_mp_l2_prefetch_failure": "l2_prefetch_failures",
}
EARLY_EXIT_STEM = "lmcache_mp_lookup_early_exit"


def parse_server_counters(text: str) -> ServerCounters:
    """The miss-explaining counters in a `/metrics` exposition (absent ones count 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = [line for line in text.splitlines() if line.startswith(PREFIX)]
    totals: dict[str, float] = {}
    exits: dict[str, float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n" if lines else ""):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if sample.name.startswith(EARLY_EXIT_STEM):
                reason = sample.labels.get("reason", "unknown")
                exits[reason] = exits.get(reason, 0.0) + sample.value
                continue
            for stem, field in _STEMS.items():
                if sample.name.startswith(stem + "_"):
                    totals[field] = totals.get(field, 0.0) + sample.value
    return ServerCounters(
        early_exits={reason: int(count) for reason, count in exits.items()},
        **{field: int(value) for field, value in totals.items()},
    )


def directory_facts(
    lookup: Mapping[str, Any], instances: Sequence[Mapping[str, Any]], *, this_instance: str | None
) -> DirectoryFacts:
    """What `POST /directory/lookup` (and `GET /instances`) say about a prompt's chunks, read
    for the first chunk: who else holds it in L1, and whether its L2 copy was stored by a
    server that is no longer registered."""
    results = [r for r in lookup.get("results") or [] if isinstance(r, dict)]
    hashes = [str((r.get("key") or {}).get("chunk_hash_hex") or "") for r in results]
    registered = {str(i.get("instance_id")) for i in instances}
    placements = (
        [p for p in (results[0].get("placements") or []) if isinstance(p, dict)] if results else []
    )
    elsewhere = sorted(
        {
            str(p.get("instance_id"))
            for p in placements
            if p.get("tier") == "l1" and str(p.get("instance_id")) != this_instance
        }
    )
    gone = any(
        p.get("tier") == "l2" and str(p.get("instance_id")) not in registered for p in placements
    )
    return DirectoryFacts(
        chunks=int(lookup.get("chunks") or 0),
        chunk_hashes=hashes,
        l1_elsewhere=elsewhere,
        l2_by_gone=gone,
    )
