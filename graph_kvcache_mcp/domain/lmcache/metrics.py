"""`lmcache server`'s own counters (its HTTP port's `/metrics`), and what moved between two reads.
Pure: parses text, no I/O.

The lookup counters (`lmcache_mp_lookup_*_tokens_total`) count prompt tokens vLLM's MP connector
asked the server for and where they were found: its L1 (host memory) or an L2 adapter (the
engine). Together with vLLM's `vllm:external_prefix_cache_hits_total` they split a call's cached
tokens into vLLM's own prefix cache, LMCache L1 and L2.

LMCache P2P (a peer server's L1, reached through its `p2p` L2 adapter) lands in the same L2
token counter: LMCache 0.5.6 counts lookup tokens per tier, never per adapter. Its only
per-adapter counter is of load tasks (`lmcache_mp_l2_load_completed_requests_total{l2_name}`):
`p2p_loads` are those of the `p2p` adapter, `l2_loads` those of every adapter, so a window in
which P2P loaded nothing has an L2 that is the engine's, and one in which only P2P loaded has an
L2 that is the peers'; a window with both cannot be split by tokens.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PREFIX = "lmcache_mp_"
_COUNTERS = {
    "lmcache_mp_lookup_requested_tokens_total": "lookup_tokens",
    "lmcache_mp_lookup_hit_tokens_total": "hit_tokens",
    "lmcache_mp_lookup_hit_l1_tokens_total": "l1_hit_tokens",
    "lmcache_mp_lookup_hit_l2_tokens_total": "l2_hit_tokens",
    "lmcache_mp_lookups_requests_total": "lookups",
    "lmcache_mp_lookup_early_exit_requests_total": "early_exits",
    "lmcache_mp_l2_store_completed_objects_chunks_total": "l2_stored_chunks",
    "lmcache_mp_l2_prefetch_load_completed_chunks_total": "l2_loaded_chunks",
    "lmcache_mp_l2_usage_bytes": "l2_usage_bytes",
    "lmcache_mp_l2_load_completed_requests_total": "l2_loads",
}
L2_LOADS_BY_ADAPTER = "lmcache_mp_l2_load_completed_requests_total"
P2P_ADAPTER = "p2p"
"""LMCache's registered type name of its P2P L2 adapter (the `l2_name` label of its counters)."""


class LmcacheCounters(BaseModel):
    """The server's lookup and L2 counters (summed over models and salts); None = not exported."""

    model_config = ConfigDict(frozen=True)

    lookups: int | None = Field(None, description="Lookup requests from vLLM connectors.")
    early_exits: int | None = Field(None, description="Lookups that exited before probing.")
    lookup_tokens: int | None = Field(None, description="Prompt tokens looked up.")
    hit_tokens: int | None = Field(None, description="Of those, found (L1 + L2).")
    l1_hit_tokens: int | None = Field(None, description="Found in the server's L1.")
    l2_hit_tokens: int | None = Field(
        None,
        description="Found in an L2 adapter: the engine, and LMCache P2P peers when P2P is "
        "configured (LMCache counts no tokens per adapter; p2p_loads tells them apart).",
    )
    l2_stored_chunks: int | None = Field(None, description="Chunks stored to L2.")
    l2_loaded_chunks: int | None = Field(None, description="Chunks loaded from L2.")
    l2_usage_bytes: int | None = Field(None, description="Bytes the L2 adapters hold (a gauge).")
    l2_loads: int | None = Field(None, description="Load tasks every L2 adapter completed.")
    p2p_loads: int | None = Field(
        None,
        description="Of those, load tasks LMCache's P2P adapter completed (from a peer "
        "server's L1, not the engine); 0 when P2P is not configured.",
    )

    @property
    def l2_chunk_bytes(self) -> int | None:
        """Bytes of one stored chunk (LMCache stores whole, equal chunks); None before any."""
        if not self.l2_usage_bytes or not self.l2_stored_chunks:
            return None
        return self.l2_usage_bytes // self.l2_stored_chunks


def parse_lmcache_counters(text: str) -> LmcacheCounters:
    """The counters in a `/metrics` exposition (lines of other metrics are skipped); all None
    when it holds no LMCache MP metric at all (not an lmcache server)."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = [line for line in text.splitlines() if line.startswith(PREFIX)]
    if not lines:
        return LmcacheCounters()
    # A labelled counter appears with its first increment: a server that exports its metrics
    # but has not looked anything up yet has counted 0.
    totals = dict.fromkeys([*_COUNTERS.values(), "p2p_loads"], 0.0)
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            field = _COUNTERS.get(sample.name)
            if field is not None:
                totals[field] += sample.value
            if sample.name == L2_LOADS_BY_ADAPTER and sample.labels.get("l2_name") == P2P_ADAPTER:
                totals["p2p_loads"] += sample.value
    return LmcacheCounters(**{name: int(value) for name, value in totals.items()})


def counters_moved(before: LmcacheCounters, after: LmcacheCounters) -> LmcacheCounters:
    """What each counter did between two reads; None where either lacks it or it went back (a
    restarted server)."""
    moved: dict[str, int | None] = {}
    for name in LmcacheCounters.model_fields:
        old, new = getattr(before, name), getattr(after, name)
        moved[name] = new - old if old is not None and new is not None and new >= old else None
    return LmcacheCounters(**moved)
