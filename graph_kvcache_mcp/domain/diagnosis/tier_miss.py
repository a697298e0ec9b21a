"""Why a prompt's next request misses each tier behind one vLLM instance: vLLM's own prefix cache,
its LMCache server's L1 (host memory) and L2 (the engine). Pure: no I/O.

The facts come from what each part reports about itself: the KV-event index and vLLM's /metrics,
the coordinator's directory (which server holds which chunk in which tier, and the hashes it
computed), the server's own counters (lookups that exited early, L1 evictions, L2 stores
submitted and completed), the engine's answer to HEAD on the computed chunk keys. The rules here
turn them into one verdict per tier, what the next request takes from it, and the configuration
mismatches that make every tier miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.diagnosis.tier_facts import TierFacts
from graph_kvcache_mcp.domain.fleet.tiers import TierHeld, connector_tokens
from graph_kvcache_mcp.domain.lmcache.chunk_keys import SEED_FREE_HASH

MissKind = Literal[
    "served",
    "not_needed",
    "never_stored",
    "evicted",
    "restarted",
    "other_server",
    "server_restarted",
    "stores_failing",
    "no_l2",
    "too_short",
    "down",
    "unknown",
]

EARLY_EXIT_MEANING = {
    "no_gpu_context": "no vLLM of this model and world size is registered with the server (a "
    "model name that differs, or vLLM not attached to this server)",
    "empty_chunk_hashes": "the prompt is shorter than one chunk",
    "no_group_layout_descs": "the server knows no KV layout for this model",
}


class TierVerdict(BaseModel):
    """One tier: what it holds of the prompt, what the next request takes from it, and why not
    more."""

    model_config = ConfigDict(frozen=True)

    tier: Literal["vllm", "l1", "l2"]
    held_tokens: int | None = Field(description="Leading prompt tokens it holds; None: unknown.")
    serves_tokens: int | None = Field(
        description="Of the next request's cached tokens, those this tier gives; None: unknown."
    )
    why: MissKind
    detail: str


class TierMiss(BaseModel):
    """The next request for the prompt, tier by tier."""

    model_config = ConfigDict(frozen=True)

    lmcache_url: str
    prompt_tokens: int
    cached_tokens: int | None = Field(
        description="What the next request gets in all (vLLM's own or the connector's)."
    )
    tiers: list[TierVerdict]
    early_exits: dict[str, str] = Field(
        default_factory=dict, description="LMCache lookups that exited before probing, by reason."
    )
    mismatches: list[str] = Field(
        default_factory=list, description="Configuration that makes every tier miss, with fix."
    )


def explain_tiers(facts: TierFacts, *, lmcache_url: str) -> TierMiss:
    """One verdict per tier, the split of the next request's cached tokens, and the mismatches."""
    n, chunk = facts.prompt_tokens, facts.chunk_size
    vllm_held = _vllm_held(facts)
    local = None if vllm_held is None else _whole_blocks(vllm_held, n, facts.block_size)
    l1 = facts.tiers.get("l1")
    l2 = facts.tiers.get("l2")
    l1_held = l1.tokens if l1 else None
    l2_held = l2.tokens if l2 else None
    l1_end = connector_tokens(l1_held or 0, prompt_tokens=n, chunk_size=chunk)
    both_end = connector_tokens(max(l1_held or 0, l2_held or 0), prompt_tokens=n, chunk_size=chunk)
    total = None if local is None else max(local, both_end)
    from_l1 = from_l2 = None
    if local is not None and total is not None:
        # LMCache finds L1's chunks from the start, then L2's past them; vLLM takes the tail
        # past its own hit (as `tiers_taken` splits a call)
        from_l1 = None if l1_held is None else max(0, min(l1_end, total) - local)
        from_l2 = None if l2_held is None else max(0, total - max(local, l1_end))
    stored_anywhere = bool(l1_held) or bool(l2_held)
    verdicts = [
        _vllm_verdict(facts, vllm_held, local, stored_anywhere),
        _l1_verdict(facts, l1, from_l1, l2_held),
        _l2_verdict(facts, l2, from_l2, l1_end),
    ]
    exits = {
        reason: f"{count} lookup(s): {EARLY_EXIT_MEANING.get(reason, reason)}"
        for reason, count in sorted((facts.counters.early_exits if facts.counters else {}).items())
        if count
    }
    return TierMiss(
        lmcache_url=lmcache_url,
        prompt_tokens=n,
        cached_tokens=total,
        tiers=verdicts,
        early_exits=exits,
        mismatches=mismatches(facts),
    )


def _vllm_held(facts: TierFacts) -> int | None:
    tier = facts.tiers.get("vllm")
    if tier is not None and tier.tokens is not None:
        return tier.tokens
    counted = facts.vllm_counted_prompt_tokens
    if counted is not None and counted < facts.prompt_tokens:
        return 0  # this process has not yet computed a prompt this long: it cannot hold it
    return None


def _whole_blocks(held: int, prompt_tokens: int, block_size: int | None) -> int:
    if not block_size:
        return held
    return min(held, max(prompt_tokens - 1, 0) // block_size * block_size)


def _vllm_verdict(
    facts: TierFacts, held: int | None, local: int | None, stored_anywhere: bool
) -> TierVerdict:
    tier = facts.tiers.get("vllm")
    if held is None:
        unread = tier.reason if tier is not None and tier.reason else "not indexed"
        detail = (
            f"unknown: {unread}; vLLM has counted {facts.vllm_counted_prompt_tokens} prompt tokens "
            "since it started, so it may hold the prompt (start it with kv_events to know)"
        )
        return TierVerdict(
            tier="vllm", held_tokens=None, serves_tokens=None, why="unknown", detail=detail
        )
    if local:
        detail = f"vLLM's own prefix cache holds {held} leading tokens; it serves {local}"
        return TierVerdict(
            tier="vllm", held_tokens=held, serves_tokens=local, why="served", detail=detail
        )
    counted = facts.vllm_counted_prompt_tokens
    restarted = counted is not None and counted < facts.prompt_tokens
    if stored_anywhere and (restarted or facts.vllm_feed_resets):
        why: MissKind = "restarted"
        detail = (
            "vLLM restarted (or its cache was reset) since the prompt was computed: this process "
            f"has counted {counted} prompt tokens, fewer than the prompt's {facts.prompt_tokens}; "
            "LMCache kept it"
        )
    elif stored_anywhere:
        why = "evicted"
        usage = "" if facts.vllm_kv_usage is None else f" (KV usage {facts.vllm_kv_usage:.0%})"
        detail = (
            "LMCache holds the prompt but vLLM's cache does not: evicted for newer blocks"
            f"{usage}, or it was computed by another vLLM on the same server"
        )
    else:
        why = "never_stored"
        detail = "no tier holds the prompt: it was never sent here (or everything was evicted)"
    return TierVerdict(tier="vllm", held_tokens=held, serves_tokens=0, why=why, detail=detail)


def _l1_verdict(
    facts: TierFacts, tier: TierHeld | None, serves: int | None, l2_held: int | None
) -> TierVerdict:
    if tier is None or tier.tokens is None:
        reason = tier.reason if tier is not None and tier.reason else "not checked"
        kind: MissKind = "down" if reason.startswith("unknown") else "unknown"
        return TierVerdict(tier="l1", held_tokens=None, serves_tokens=None, why=kind, detail=reason)
    held = tier.tokens
    if held and serves is None:
        return _depends_on_vllm("l1", held)
    if held and serves:
        return TierVerdict(
            tier="l1", held_tokens=held, serves_tokens=serves, why="served",
            detail=f"this server's L1 holds {held} leading tokens; the next request takes "
            f"{serves} from it",
        )  # fmt: skip
    if held:
        return TierVerdict(
            tier="l1", held_tokens=held, serves_tokens=0, why="not_needed",
            detail=f"L1 holds {held} leading tokens, no more than vLLM's own cache serves",
        )  # fmt: skip
    short = _too_short(facts)
    if short is not None:
        return TierVerdict(tier="l1", held_tokens=0, serves_tokens=0, why="too_short", detail=short)
    directory = facts.directory
    counters = facts.counters
    if directory is not None and directory.l1_elsewhere:
        others = ", ".join(directory.l1_elsewhere[:3])
        why: MissKind = "other_server"
        detail = (
            f"another LMCache server holds it in L1 ({others}): route the request to a vLLM on "
            "that server, or warm this one (cache_warm)"
        )
    elif directory is not None and directory.l2_by_gone:
        why = "server_restarted"
        detail = (
            "the server that stored it has gone (its L2 placement names an instance no longer "
            "registered): this server restarted, and L1 is memory only"
        )
    elif l2_held:
        why = "evicted"
        evicted = "" if counters is None else f" (the server evicted {counters.l1_evicted_chunks}"
        evicted += "" if counters is None else " chunks from L1 for memory since it started)"
        detail = (
            f"L2 holds it but L1 does not: evicted from L1, by memory pressure or a delete "
            f"(cache_evict){evicted}"
        )
    else:
        why = "never_stored"
        detail = "never stored: no LMCache server has seen this prompt"
    return TierVerdict(tier="l1", held_tokens=0, serves_tokens=0, why=why, detail=detail)


def _l2_verdict(
    facts: TierFacts, tier: TierHeld | None, serves: int | None, l1_end: int
) -> TierVerdict:
    if tier is None or tier.tokens is None:
        reason = tier.reason if tier is not None and tier.reason else "not checked"
        kind: MissKind = "down" if reason.startswith("unknown") else "unknown"
        detail = reason if kind == "unknown" else f"engine or server down: {reason}"
        return TierVerdict(tier="l2", held_tokens=None, serves_tokens=None, why=kind, detail=detail)
    held = tier.tokens
    if held and serves is None:
        return _depends_on_vllm("l2", held)
    if held and serves:
        return TierVerdict(
            tier="l2", held_tokens=held, serves_tokens=serves, why="served",
            detail=f"the engine holds {held} leading tokens; the next request loads {serves} "
            "from it (past what L1 and vLLM serve)",
        )  # fmt: skip
    if held:
        return TierVerdict(
            tier="l2", held_tokens=held, serves_tokens=0, why="not_needed",
            detail=f"the engine holds {held} leading tokens, no more than L1 or vLLM serve",
        )  # fmt: skip
    if tier.reason and "no engine L2 adapter" in tier.reason:
        return TierVerdict(
            tier="l2", held_tokens=0, serves_tokens=0, why="no_l2", detail=tier.reason
        )
    short = _too_short(facts)
    if short is not None:
        return TierVerdict(tier="l2", held_tokens=0, serves_tokens=0, why="too_short", detail=short)
    counters = facts.counters
    lost = (
        0
        if counters is None
        else counters.l2_store_submitted_chunks - counters.l2_store_completed_chunks
    )
    if counters is not None and lost > 0:
        return TierVerdict(
            tier="l2", held_tokens=0, serves_tokens=0, why="stores_failing",
            detail=f"L2 stores are failing or stuck: {lost} of "
            f"{counters.l2_store_submitted_chunks} chunks submitted since the server started "
            "never completed; check the engine (diagnose_stack) and the server's log",
        )  # fmt: skip
    if l1_end:
        detail = (
            "not yet in the engine: L1 holds it and LMCache stores to L2 after the request "
            "returns (seconds)"
        )
    else:
        detail = "never stored: the engine holds none of its chunks under this server's keys"
    return TierVerdict(tier="l2", held_tokens=0, serves_tokens=0, why="never_stored", detail=detail)


def _depends_on_vllm(tier: Literal["l1", "l2"], held: int) -> TierVerdict:
    detail = (
        f"holds {held} leading tokens; what the next request takes from it depends on vLLM's "
        "own cache, which is unknown"
    )
    return TierVerdict(
        tier=tier, held_tokens=held, serves_tokens=None, why="unknown", detail=detail
    )


def _too_short(facts: TierFacts) -> str | None:
    if facts.prompt_tokens - 1 >= facts.chunk_size:
        return None
    return (
        f"the prompt ({facts.prompt_tokens} tokens) is shorter than one LMCache chunk "
        f"({facts.chunk_size}) plus its last token: LMCache stores and loads whole chunks only"
    )


def mismatches(facts: TierFacts) -> list[str]:
    """Configuration that makes every LMCache tier miss for every prompt, each with its fix."""
    out: list[str] = []
    block, chunk = facts.block_size, facts.chunk_size
    if block and chunk % block:
        out.append(
            f"chunk size {chunk} is not a multiple of vLLM's block size {block}: restart the "
            "lmcache server with a multiple of the block"
        )
    if facts.hash_algorithm != SEED_FREE_HASH:
        seeds = facts.hash_seeds
        known = ", ".join(f"{name} {seed or 'unset'}" for name, seed in sorted(seeds.items()))
        differ = None in seeds.values() or len(set(seeds.values())) > 1
        out.append(
            f"the server hashes chunks with {facts.hash_algorithm!r}, seeded from PYTHONHASHSEED"
            + (f" ({known}: they differ or one is unset)" if seeds and differ else "")
            + ": vLLM, every server and the coordinator must share one fixed PYTHONHASHSEED "
            "(or use blake3)"
        )
    directory = facts.directory
    if directory is None:
        return out
    whole = facts.prompt_tokens // chunk
    if directory.chunks != whole:
        cut = facts.prompt_tokens // directory.chunks if directory.chunks else None
        size = f"about {cut}" if cut else "more than the prompt"
        out.append(
            f"the coordinator cut the prompt into {directory.chunks} chunks, the server into "
            f"{whole}: its chunk size ({size}) is not the server's {chunk}; restart the "
            f"coordinator with --chunk-size {chunk}"
        )
    elif _hashes_differ(facts.expected_hashes, directory.chunk_hashes):
        out.append(
            "the coordinator hashes chunks differently from the server (another --hash-algorithm "
            f"or seed): restart it with --hash-algorithm {facts.hash_algorithm}"
        )
    return out


def _hashes_differ(expected: Sequence[str] | None, seen: Sequence[str]) -> bool:
    if not expected or not seen:
        return False
    return expected[0] != seen[0]


def salt_mismatch(first_salt: object, second_salt: object) -> str | None:
    """A `cache_salt` that differs between two requests: vLLM and LMCache key blocks per salt."""
    if first_salt == second_salt:
        return None
    return (
        f"the requests carry different cache_salt values ({first_salt!r}, {second_salt!r}): vLLM "
        "and LMCache keep each salt's blocks apart, so they never share a prefix; send one salt"
    )
