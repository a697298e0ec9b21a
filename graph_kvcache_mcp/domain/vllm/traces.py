"""Per-call cache accounting (`Trace`) and its summary over a run. Pure: no I/O, no clock.

A `Trace` says how many prompt tokens vLLM served from its prefix cache, and where that number came
from: the response's `usage.prompt_tokens_details.cached_tokens` (`usage`), the difference of the
server's `vllm:prefix_cache_hits_total` counter around the call (`metrics_delta`), or nowhere
(`unavailable`). An unknown count stays `None`: "no cache info" must never read as "no cache hit".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graph_kvcache_mcp.domain.latency import percentile

CachedTokensSource: TypeAlias = Literal["usage", "metrics_delta", "unavailable"]


class Trace(BaseModel):
    """One chat/completion call as vLLM accounted for it."""

    model_config = ConfigDict(frozen=True)

    model: str
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    prefix_cache_hit_tokens: int | None = Field(
        None, ge=0, description="Prompt tokens served from the prefix cache; None when unknown."
    )
    prefix_cache_miss_tokens: int | None = Field(
        None,
        ge=0,
        description="Prompt tokens computed for this call (prompt - hit); None if unknown.",
    )
    external_cache_hit_tokens: int | None = Field(
        None,
        ge=0,
        description="Of the hit, tokens a KV connector loaded from an external tier (the engine "
        "via EngineKVConnector, LMCache): the vllm:external_prefix_cache_hits_total delta around "
        "the call, when no other request ran; None when not measured or no connector runs. The "
        "rest of the hit is vLLM's own prefix cache.",
    )
    external_bytes_read: int | None = Field(
        None,
        ge=0,
        description="Engine bytes EngineKVConnector read for the external hit (the "
        "graph_kvcache:engine_kv_loaded_bytes_total delta); None when not measured.",
    )
    lmcache_l1_hit_tokens: int | None = Field(
        None,
        ge=0,
        description="Of the external hit, tokens LMCache found in its server's L1 (host memory); "
        "None when not measured or no lmcache server runs.",
    )
    lmcache_l2_hit_tokens: int | None = Field(
        None,
        ge=0,
        description="Of the external hit, tokens LMCache found in L2 (the engine); None when not "
        "measured.",
    )
    lmcache_p2p_hit_tokens: int | None = Field(
        None,
        ge=0,
        description="Of the external hit, tokens LMCache P2P loaded from a peer server's L1 "
        "(not the engine); None when not measured or P2P is not reported.",
    )
    cached_tokens_source: CachedTokensSource = Field(
        description="usage: the response said; metrics_delta: the server's counters moved by this "
        "much around the call; unavailable: neither could tell."
    )
    latency_s: float = Field(ge=0, description="Wall time of the whole call.")
    ttft_s: float | None = Field(None, ge=0, description="Time to first token, when streamed.")
    stream: bool = False
    finish_reason: str | None = None
    started_at: float | None = Field(None, description="Unix time the call started.")
    note: str | None = Field(None, description="Why the cache count is missing or approximate.")

    @property
    def local_cache_hit_tokens(self) -> int | None:
        """Hit tokens from vLLM's own prefix cache: the hit less the external part, when both
        are known."""
        if self.prefix_cache_hit_tokens is None or self.external_cache_hit_tokens is None:
            return None
        return max(0, self.prefix_cache_hit_tokens - self.external_cache_hit_tokens)

    @property
    def hit_rate(self) -> float | None:
        """Share of this call's prompt served from cache; None when unknown or prompt empty."""
        if self.prefix_cache_hit_tokens is None or self.prompt_tokens == 0:
            return None
        return self.prefix_cache_hit_tokens / self.prompt_tokens


def cache_split(prompt_tokens: int, hit_tokens: int | None) -> tuple[int | None, int | None]:
    """(hit, miss) for a call; both None when the hit count is unknown. Clamps hit to the prompt."""
    if hit_tokens is None:
        return None, None
    hit = max(0, min(hit_tokens, prompt_tokens))
    return hit, prompt_tokens - hit


class ComputeSavedEstimate(BaseModel):
    """Prefill time the cache hits saved, from this run's own cold calls: an estimate."""

    model_config = ConfigDict(frozen=True)

    seconds: float = Field(ge=0)
    prefill_tokens_per_s: float = Field(gt=0)
    cold_calls: int = Field(ge=1)
    timing: Literal["ttft", "latency"]
    basis: str


class TraceSummary(BaseModel):
    """What a run of calls got from the prefix cache."""

    model_config = ConfigDict(frozen=True)

    calls: int
    calls_with_cache_info: int = Field(description="Calls whose hit count is known.")
    calls_by_source: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens_saved: int = Field(description="Prompt tokens served from cache (known calls).")
    tokens_saved_by_tier: dict[str, int] | None = Field(
        None,
        description="Saved tokens split into 'local' (vLLM's prefix cache) and 'external' (a KV "
        "connector's tier), over the calls whose external part was measured, and the external "
        "part into 'lmcache_l1', 'lmcache_l2' (the engine) and 'lmcache_p2p' (LMCache P2P "
        "peers, when they served any) where LMCache's split was measured; None if none was.",
    )
    avg_prefix_cache_hit_rate: float | None = Field(
        None, description="Mean of the per-call hit rates over calls with cache info."
    )
    token_hit_rate: float | None = Field(
        None, description="Cached prompt tokens / prompt tokens, over calls with cache info."
    )
    estimated_compute_saved_s: float | None = Field(
        None, description="Prefill seconds saved, estimated; see compute_saved.basis."
    )
    compute_saved: ComputeSavedEstimate | None = None
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    ttft_p50_s: float | None = None
    note: str | None = None


def summarize(traces: Sequence[Trace]) -> TraceSummary:
    """Totals, hit rates, latency percentiles and an estimate of the prefill time saved."""
    known = [t for t in traces if t.prefix_cache_hit_tokens is not None]
    by_source: dict[str, int] = {}
    for trace in traces:
        by_source[trace.cached_tokens_source] = by_source.get(trace.cached_tokens_source, 0) + 1
    saved = sum(t.prefix_cache_hit_tokens or 0 for t in known)
    known_prompt = sum(t.prompt_tokens for t in known)
    rates = [rate for t in known if (rate := t.hit_rate) is not None]
    estimate = _compute_saved(known, saved)
    ttfts = [t.ttft_s for t in traces if t.ttft_s is not None]
    note = None
    if traces and not known:
        note = (
            "no call carried cache info: start vLLM with --enable-prompt-tokens-details "
            "(or let the client read /metrics) to see prefix-cache hits"
        )
    return TraceSummary(
        calls=len(traces),
        calls_with_cache_info=len(known),
        calls_by_source=dict(sorted(by_source.items())),
        prompt_tokens=sum(t.prompt_tokens for t in traces),
        completion_tokens=sum(t.completion_tokens for t in traces),
        total_tokens_saved=saved,
        tokens_saved_by_tier=_by_tier(known),
        avg_prefix_cache_hit_rate=sum(rates) / len(rates) if rates else None,
        token_hit_rate=saved / known_prompt if known_prompt else None,
        estimated_compute_saved_s=estimate.seconds if estimate else None,
        compute_saved=estimate,
        latency_p50_s=percentile([t.latency_s for t in traces], 50),
        latency_p95_s=percentile([t.latency_s for t in traces], 95),
        ttft_p50_s=percentile(ttfts, 50),
        note=note,
    )


def _by_tier(known: Sequence[Trace]) -> dict[str, int] | None:
    split = [t for t in known if t.local_cache_hit_tokens is not None]
    if not split:
        return None
    tiers = {
        "local": sum(t.local_cache_hit_tokens or 0 for t in split),
        "external": sum(t.external_cache_hit_tokens or 0 for t in split),
    }
    lmcache = [
        t
        for t in split
        if t.lmcache_l1_hit_tokens is not None and t.lmcache_l2_hit_tokens is not None
    ]
    if lmcache:
        tiers["lmcache_l1"] = sum(t.lmcache_l1_hit_tokens or 0 for t in lmcache)
        tiers["lmcache_l2"] = sum(t.lmcache_l2_hit_tokens or 0 for t in lmcache)
        if p2p := sum(t.lmcache_p2p_hit_tokens or 0 for t in lmcache):
            tiers["lmcache_p2p"] = p2p
    return tiers


def _compute_saved(known: Sequence[Trace], saved_tokens: int) -> ComputeSavedEstimate | None:
    """Saved tokens / the prefill throughput of the run's cold calls (no cache hit at all).

    A streamed cold call's TTFT is nearly all prefill; without streaming the whole latency also
    holds decoding, so throughput reads low and the estimate high — the basis says which was used.
    """
    cold = [t for t in known if t.prefix_cache_hit_tokens == 0 and t.prompt_tokens > 0]
    if not cold or saved_tokens == 0:
        return None
    streamed = [t for t in cold if t.ttft_s is not None and t.ttft_s > 0]
    timing: Literal["ttft", "latency"] = "ttft" if streamed else "latency"
    chosen = streamed or [t for t in cold if t.latency_s > 0]
    seconds = sum((t.ttft_s or 0.0) if timing == "ttft" else t.latency_s for t in chosen)
    if not chosen or seconds <= 0:
        return None
    tokens = sum(t.prompt_tokens for t in chosen)
    throughput = tokens / seconds
    upper = "" if timing == "ttft" else " (latency includes decoding, so this is an upper bound)"
    return ComputeSavedEstimate(
        seconds=saved_tokens / throughput,
        prefill_tokens_per_s=throughput,
        cold_calls=len(chosen),
        timing=timing,
        basis=f"{saved_tokens} cached tokens / {throughput:.0f} prompt tokens/s measured over "
        f"{len(chosen)} cold call(s) of this run by {timing}{upper}",
    )


def parse_trace_lines(lines: Iterable[str]) -> tuple[list[Trace], list[int]]:
    """Traces from JSONL lines, and the 1-based numbers of the lines that were not a Trace."""
    traces: list[Trace] = []
    bad: list[int] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            traces.append(Trace.model_validate(json.loads(line)))
        except (ValueError, ValidationError):
            bad.append(number)
    return traces, bad
