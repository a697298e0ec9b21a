"""What one vLLM call yields and how its cached tokens are attributed. Pure: no I/O, no clock.

The cached-token count of a call comes, in order of trust, from
1. the response's `usage.prompt_tokens_details.cached_tokens` (`source="usage"`), which vLLM fills
   only when it runs with `--enable-prompt-tokens-details`;
2. the move of the server's `vllm:prefix_cache_hits_total` across the call (`"metrics_delta"`),
   trusted only when `vllm:prompt_tokens_total` moved by exactly this call's prompt tokens: when
   other requests moved the counters too, the hits cannot be told apart;
3. nowhere (`"unavailable"`, with a note). Never 0 for "unknown".

Where vLLM runs with a KV connector (an external tier: the engine through EngineKVConnector,
LMCache), the hit is split by tier from the same /metrics window: the move of
`vllm:external_prefix_cache_hits_total` is the connector's part, and with EngineKVConnector the move
of `graph_kvcache:engine_kv_loaded_bytes_total` is what it read from the engine. That split is
trusted, like the metrics-delta source, only when the window saw this call alone. With LMCache's
MP connector the external part splits once more, into the lmcache server's L1 and L2 (the
engine), from the move of the server's own lookup counters across the call, trusted only when
the server counted this call's one lookup.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.metrics import MetricsDelta, MetricsSnapshot, delta
from graph_kvcache_mcp.domain.vllm.traces import CachedTokensSource, Trace

DEFAULT_MAX_TOKENS = 64
AnswerTokens = Annotated[int, Field(ge=1, le=4096)]
Temperature = Annotated[float, Field(ge=0, le=2)]
"""The bounds of a chat call's own parameters (vllm_chat, `vllm chat`)."""


class ChatResult(BaseModel):
    """The model's answer and the call's cache accounting."""

    model_config = ConfigDict(frozen=True)

    answer: str
    trace: Trace


class PrefixCacheReset(BaseModel):
    """What `POST /reset_prefix_cache` did."""

    model_config = ConfigDict(frozen=True)

    reset: bool
    dev_mode: bool = Field(description="False when the route is absent (VLLM_SERVER_DEV_MODE off).")
    reason: str | None = None


class CachedTokens(BaseModel):
    """How many prompt tokens of one call came from the prefix cache, and how that is known."""

    model_config = ConfigDict(frozen=True)

    hit_tokens: int | None
    source: CachedTokensSource
    note: str | None = None
    external_tokens: int | None = Field(
        None, description="Of the hit, tokens a KV connector loaded; None when not measured."
    )
    external_bytes: int | None = Field(
        None, description="Engine bytes EngineKVConnector read for them; None when not measured."
    )
    l1_tokens: int | None = Field(
        None, description="Of the external part, found in the lmcache server's L1."
    )
    l2_tokens: int | None = Field(
        None, description="Of the external part, found in the lmcache server's L2 (the engine)."
    )
    p2p_tokens: int | None = Field(
        None,
        description="Of the external part, loaded by LMCache P2P from a peer server's L1 (not "
        "the engine); 0 when P2P loaded nothing during the call.",
    )


class MetricsWindow(BaseModel):
    """What the server's counters did between a snapshot before a call and one after it."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int | None = Field(None, description="Move of vllm:prompt_tokens_total.")
    hits: int | None = Field(None, description="Move of vllm:prefix_cache_hits_total (tokens).")
    queries: int | None = Field(None, description="Move of vllm:prefix_cache_queries_total.")
    external_hits: int | None = Field(
        None, description="Move of vllm:external_prefix_cache_hits_total (a KV connector's loads)."
    )
    engine_bytes_read: int | None = Field(
        None, description="Move of graph_kvcache:engine_kv_loaded_bytes_total (EngineKVConnector)."
    )
    external_tier: bool = Field(
        False,
        description="The server runs a KV connector: its external queries have moved since it "
        "started, or it exports EngineKVConnector's counters.",
    )
    block_size: int | None = None

    def exclusive_to(self, prompt_tokens: int) -> bool:
        """True when only a call of `prompt_tokens` moved the counters (no other traffic)."""
        return self.prompt_tokens == prompt_tokens


def metrics_window(before: MetricsSnapshot, after: MetricsSnapshot) -> MetricsWindow:
    """The window between two snapshots of the same model (a counter reset reads as None)."""
    moved = delta(before, after)
    return MetricsWindow(
        prompt_tokens=moved.prompt_tokens,
        hits=moved.prefix_cache_hits_tokens,
        queries=moved.prefix_cache_queries_tokens,
        external_hits=moved.external_prefix_cache_hits_tokens,
        engine_bytes_read=moved.engine_kv_loaded_bytes,
        # vLLM exports the external counters with or without a connector, but only a connector
        # moves them: every request it admits queries the external tier.
        external_tier=bool(after.external_prefix_cache_queries_tokens)
        or after.engine_kv_loaded_bytes is not None,
        block_size=after.cache_config.block_size if after.cache_config else None,
    )


def from_usage(cached_tokens: int) -> CachedTokens:
    return CachedTokens(hit_tokens=cached_tokens, source="usage")


def unattributed(note: str) -> CachedTokens:
    return CachedTokens(hit_tokens=None, source="unavailable", note=note)


def from_window(
    window: MetricsWindow,
    prompt_tokens: int,
    lmcache: LmcacheCounters | Unavailable | None = None,
) -> CachedTokens:
    """The call's hits as the move of the server's counters, when only this call moved them."""
    if window.prompt_tokens is None or window.hits is None:
        return unattributed("the server's /metrics lacks the prefix-cache counters")
    if (why := _not_this_call_alone(window, prompt_tokens)) is not None:
        return unattributed(f"{why}, so the hit count cannot be attributed")
    # vllm:prefix_cache_hits_total counts vLLM's own cache only; a KV connector's loads (the
    # engine, LMCache) move the external counter instead, and belong to the call's hit too.
    external = window.external_hits
    cached = CachedTokens(
        hit_tokens=window.hits + (external or 0),
        external_tokens=external,
        external_bytes=window.engine_bytes_read,
        source="metrics_delta",
        note="from the move of vllm:prefix_cache_hits_total across the call (vLLM runs without "
        "--enable-prompt-tokens-details)",
    )
    return cached if lmcache is None or external is None else split_lmcache_tiers(cached, lmcache)


def split_by_tier(
    cached: CachedTokens,
    window: MetricsWindow,
    prompt_tokens: int,
    lmcache: LmcacheCounters | Unavailable | None = None,
) -> CachedTokens:
    """`cached` (reported by the answer) with its external part from the window around the call,
    when the server has an external tier and only this call moved its counters; with `lmcache`
    (what the lmcache server's counters did across the call) the external part is split again
    into its L1 and L2."""
    if not window.external_tier or window.external_hits is None:
        return cached
    if (why := _not_this_call_alone(window, prompt_tokens)) is not None:
        note = (
            f"{why}, so the hit cannot be split between vLLM's prefix cache and the KV "
            "connector's tier"
        )
        return cached.model_copy(update={"note": note})
    split = cached.model_copy(
        update={"external_tokens": window.external_hits, "external_bytes": window.engine_bytes_read}
    )
    return split if lmcache is None else split_lmcache_tiers(split, lmcache)


def split_lmcache_tiers(cached: CachedTokens, moved: LmcacheCounters | Unavailable) -> CachedTokens:
    """The external part split into the lmcache server's L1 and L2 from the move of its lookup
    counters, trusted when the server saw this call's lookup alone (it may serve other vLLMs)."""
    if isinstance(moved, Unavailable):
        why = f"the lmcache server's counters were not readable ({moved.reason})"
        return cached.model_copy(update={"note": _joined(cached.note, why)})
    if moved.lookups is None or moved.l1_hit_tokens is None or moved.l2_hit_tokens is None:
        return cached.model_copy(
            update={
                "note": _joined(
                    cached.note, "the lmcache server's /metrics lacks its lookup counters"
                )
            }
        )
    if moved.lookups == 0 and not cached.external_tokens:
        return cached.model_copy(update={"l1_tokens": 0, "l2_tokens": 0, "p2p_tokens": 0})
    if moved.lookups != 1:
        why = (
            f"the lmcache server counted {moved.lookups} lookups during this call (another "
            "vLLM or request shares it), so the external hit cannot be split into L1 and L2"
        )
        return cached.model_copy(update={"note": _joined(cached.note, why)})
    taken = tiers_taken(moved.l1_hit_tokens, moved.l2_hit_tokens, cached.external_tokens)
    if taken is None:
        why = (
            f"the lmcache server found {moved.l1_hit_tokens + moved.l2_hit_tokens} tokens but "
            f"vLLM took {cached.external_tokens} from it, so the external hit cannot be split "
            "into L1 and L2"
        )
        return cached.model_copy(update={"note": _joined(cached.note, why)})
    by_source = l2_by_source(taken[1], moved)
    if by_source is None:
        why = (
            "LMCache loaded from both the engine and P2P peers during this call and counts L2 "
            f"tokens per lookup, not per adapter, so its {taken[1]} L2 tokens cannot be split "
            "between them"
        )
        split = cached.model_copy(update={"l1_tokens": taken[0], "note": _joined(cached.note, why)})
        return split
    engine, p2p = by_source
    split = cached.model_copy(
        update={"l1_tokens": taken[0], "l2_tokens": engine, "p2p_tokens": p2p}
    )
    missed = lmcache_missed(moved)
    if missed is None:
        return split
    return split.model_copy(update={"note": _joined(split.note, missed)})


def lmcache_missed(moved: LmcacheCounters) -> str | None:
    """Why this call's lookup found less than it asked LMCache for, from the same counter moves;
    None when it found all (or the counters cannot say)."""
    if moved.early_exits:
        return (
            "LMCache's lookup exited before probing L1 and L2 (an early exit; diagnose_miss's "
            "tiers name the reason)"
        )
    asked, found = moved.lookup_tokens, moved.hit_tokens
    if asked is None or found is None or found >= asked:
        return None
    return (
        f"LMCache held {found} of the {asked} whole-chunk tokens looked up; the rest is in "
        "neither L1 nor L2 (never stored, evicted, or on another server: diagnose_miss's tiers "
        "say which)"
    )


def l2_by_source(l2_tokens: int, moved: LmcacheCounters) -> tuple[int, int | None] | None:
    """`l2_tokens` as (the engine's, P2P's), from which adapters completed loads meanwhile: all
    the engine's when P2P loaded nothing (P2P's part None when the server does not say), all
    P2P's when only P2P loaded; None when both loaded (LMCache counts no tokens per adapter)."""
    p2p_loads, loads = moved.p2p_loads, moved.l2_loads
    if not p2p_loads:
        return l2_tokens, None if p2p_loads is None else 0
    if p2p_loads == loads:
        return 0, l2_tokens
    return None


def tiers_taken(l1_found: int, l2_found: int, external: int | None) -> tuple[int, int] | None:
    """Of the `external` tokens vLLM took from the connector, those from L1 and from L2; they
    sum to `external`, never more.

    LMCache's lookup counts every chunk of the prompt it holds, from the first token, also the
    ones vLLM already had in its own cache and does not load: L1 hits from the start, then L2
    past L1's last hit. vLLM takes the tail past its local hit, so L2's part of what it took is
    at most `external`, and L1 has the rest. None when the server found less than vLLM took (not
    this call's lookup alone) or vLLM's external hit is unknown.
    """
    if external is None or l1_found + l2_found < external:
        return None
    l2 = min(l2_found, external)
    return external - l2, l2


TierTokens = Annotated[
    dict[str, int] | None,
    Field(
        description="With since: the window's cached tokens by tier (local, external; of "
        "external lmcache_l1 + lmcache_l2 (the engine) + lmcache_p2p (LMCache P2P peers, when "
        "they served any), only what vLLM took): the parts sum to the whole.",
    ),
]
"""A window's cached prompt tokens by tier, as `window_tiers` counts them (vllm_metrics,
fleet_effectiveness per instance)."""


def window_tiers(window: MetricsDelta, lmcache: LmcacheCounters | None) -> dict[str, int] | None:
    """A window's cached prompt tokens by tier: `local` (vLLM's own cache) and `external` (the
    connector), and with the lmcache server's counters moved over the same window the external
    part as `lmcache_l1` + `lmcache_l2` (capped as `tiers_taken` says, over the window's sums).
    The parts sum to the whole; None when vLLM's counters of the window are unknown."""
    local, external = window.prefix_cache_hits_tokens, window.external_prefix_cache_hits_tokens
    if local is None or external is None:
        return None
    tiers = {"local": local, "external": external}
    if lmcache is None or lmcache.l1_hit_tokens is None or lmcache.l2_hit_tokens is None:
        return tiers
    taken = tiers_taken(lmcache.l1_hit_tokens, lmcache.l2_hit_tokens, external)
    by_source = None if taken is None else l2_by_source(taken[1], lmcache)
    if taken is not None and by_source is not None:
        tiers["lmcache_l1"], tiers["lmcache_l2"] = taken[0], by_source[0]
        if by_source[1]:
            tiers["lmcache_p2p"] = by_source[1]
    return tiers


def _joined(note: str | None, more: str) -> str:
    return more if note is None else f"{note}; {more}"


def _not_this_call_alone(window: MetricsWindow, prompt_tokens: int) -> str | None:
    """Why the window's moves cannot be credited to a call of `prompt_tokens` alone; None when
    they can (the prompt-token counter moved by exactly this call)."""
    if window.prompt_tokens is None:
        return "the server's /metrics lacks vllm:prompt_tokens_total"
    if window.prompt_tokens < prompt_tokens:
        return (
            f"/metrics had counted {window.prompt_tokens} of this call's {prompt_tokens} prompt "
            "tokens when the wait for it ended"
        )
    if not window.exclusive_to(prompt_tokens):
        return (
            f"/metrics counted {window.prompt_tokens} prompt tokens during this call of "
            f"{prompt_tokens}: other requests ran at the same time"
        )
    return None
