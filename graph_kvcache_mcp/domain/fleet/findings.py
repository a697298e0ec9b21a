"""What the fleet's facts mean: why instances cannot share, who is under KV pressure, and how
much each instance's prompt tokens came from where over a window. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.diagnosis.stack_facts import Severity
from graph_kvcache_mcp.domain.fleet.freshness import Freshness
from graph_kvcache_mcp.domain.fleet.memory import PoolUse, describe_pool

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


class InstanceFacts(BaseModel):
    """What one instance said about itself (None: it did not say)."""

    model_config = ConfigDict(frozen=True)

    name: str
    reachable: bool
    reason: str | None = Field(None, description="Why it is unreachable.")
    model: str | None = None
    version: str | None = None
    block_size: int | None = None
    hash_algo: str | None = Field(None, description="prefix_caching_hash_algo.")
    prefix_caching: bool | None = None
    kv_usage: float | None = Field(None, description="vllm:kv_cache_usage_perc, 0–1.")
    running: int | None = None
    waiting: int | None = None
    preemptions: int | None = None
    blocks_indexed: int = Field(0, description="Blocks the index holds for it.")
    feed: Freshness


class FleetFinding(BaseModel):
    model_config = ConfigDict(frozen=True)

    severity: Severity
    code: str
    instances: list[str]
    message: str
    fix: str


class PressureRank(BaseModel):
    model_config = ConfigDict(frozen=True)

    rank: int
    name: str
    reason: str


_SHARED = (
    ("model", "model", "serve the same model (the same weights and tokenizer) everywhere"),
    ("block_size", "block size", "start every instance with the same --block-size"),
    (
        "hash_algo",
        "prefix-caching hash algorithm",
        "start every instance with the same --prefix-caching-hash-algo",
    ),
    ("version", "vLLM version", "run one vLLM version across the fleet (block hashes differ)"),
)


def sharing_findings(facts: Sequence[InstanceFacts]) -> list[FleetFinding]:
    """Why cross-instance reuse would be silently zero, with the fix for each."""
    found: list[FleetFinding] = []
    live = [f for f in facts if f.reachable]
    for field, label, fix in _SHARED:
        values: dict[str, list[str]] = {}
        for item in live:
            value = getattr(item, field)
            if value is not None:
                values.setdefault(str(value), []).append(item.name)
        if len(values) > 1:
            seen = "; ".join(f"{v} on {', '.join(names)}" for v, names in sorted(values.items()))
            found.append(
                FleetFinding(
                    severity="error" if field != "version" else "warning",
                    code=f"{field}_mismatch",
                    instances=sorted(n for names in values.values() for n in names),
                    message=f"the instances disagree on the {label} ({seen}): a block cached on "
                    "one can never be reused by another",
                    fix=fix,
                )
            )
    for item in facts:
        found += [
            FleetFinding(
                severity=severity, code=code, instances=[item.name], message=message, fix=fix
            )
            for severity, code, message, fix in _instance_problems(item)
        ]
    return found


def _instance_problems(item: InstanceFacts) -> list[tuple[Severity, str, str, str]]:
    """(severity, code, message, fix) for what keeps one instance out of the fleet view."""
    name, feed = item.name, item.feed
    if not item.reachable:
        return [
            (
                "error",
                "unreachable",
                f"{name} does not answer ({item.reason}); its index entries are stale and not "
                "trusted",
                "start it again or remove it from the fleet file",
            )
        ]
    problems: list[tuple[Severity, str, str, str]] = []
    if item.prefix_caching is False:
        problems.append(
            (
                "error",
                "prefix_caching_off",
                f"{name} runs without prefix caching: it reuses nothing",
                "start it with --enable-prefix-caching",
            )
        )
    feed_problem = {
        "no_feed": (
            "events_off",
            f"{name} has no kv_events endpoint: where its prefixes are cached cannot be seen",
            "start it with --kv-events-config (publisher zmq, an endpoint and a "
            "replay_endpoint) and add both to the fleet file",
        ),
        "partial": (
            "feed_partial",
            f"{name}'s event history could not be replayed in full: blocks stored before it "
            "are missing, so its predictions may be short",
            "raise buffer_steps in its --kv-events-config, or reset its prefix cache so the "
            "index starts clean",
        ),
        "stale": (
            "feed_stale",
            f"{name}'s replay socket did not answer ({feed.replay_error}): its entries may be "
            "out of date",
            "check kv_events_replay against its --kv-events-config replay_endpoint",
        ),
        "never_heard": (
            "feed_silent",
            f"no event batch or replay answer came from {name}'s feed",
            "check that kv_events and kv_events_replay match its --kv-events-config",
        ),
    }.get(feed.state)
    if feed_problem is not None:
        problems.append(("warning", *feed_problem))
    return problems


def pressure_ranking(
    facts: Sequence[InstanceFacts], l1: Mapping[str, PoolUse] | None = None
) -> list[PressureRank]:
    """Reachable instances, most pressed first: preemptions, then waiting requests, then KV use,
    then the use of its LMCache server's L1 (`l1`, per instance, where known)."""
    l1 = l1 or {}
    live = [f for f in facts if f.reachable]

    def l1_ratio(name: str) -> float:
        pool = l1.get(name)
        return pool.usage_ratio or 0.0 if pool is not None else 0.0

    ordered = sorted(
        live,
        key=lambda f: (
            -(f.preemptions or 0),
            -(f.waiting or 0),
            -(f.kv_usage or 0.0),
            -l1_ratio(f.name),
        ),
    )
    return [
        PressureRank(
            rank=i + 1,
            name=f.name,
            reason=f"{f.preemptions or 0} preemptions, {f.waiting or 0} waiting, KV "
            f"{(f.kv_usage or 0.0) * 100:.1f}% used"
            + (f", LMCache L1 {describe_pool(pool)}" if (pool := l1.get(f.name)) else ""),
        )
        for i, f in enumerate(ordered)
    ]


class SourceSplit(BaseModel):
    """Prompt tokens by where they came from, over a window."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    computed: int = Field(0, description="local_compute: prefilled here.")
    local_cache: int = Field(0, description="local_cache_hit: from this instance's prefix cache.")
    from_tier: int = Field(0, description="external_kv_transfer: loaded from the shared tier.")
    hit_rate: float | None = Field(None, description="(local_cache + from_tier) / prompt_tokens.")
    tier_payoff: float | None = Field(None, description="from_tier / prompt_tokens.")
    counter_reset: bool = Field(False, description="A counter went back: a restart in the window.")


def source_split(
    before: Mapping[str, int] | None, after: Mapping[str, int] | None
) -> SourceSplit | None:
    """The move of `vllm:prompt_tokens_by_source_total` from `before` to `after` (None when the
    instance does not export it)."""
    if after is None:
        return None
    moved = {s: after.get(s, 0) - (before or {}).get(s, 0) for s in SOURCES}
    if any(v < 0 for v in moved.values()):
        return SourceSplit(counter_reset=True)
    return split_of(moved["local_compute"], moved["local_cache_hit"], moved["external_kv_transfer"])


def split_of(computed: int, local_cache: int, from_tier: int) -> SourceSplit:
    total = computed + local_cache + from_tier
    return SourceSplit(
        prompt_tokens=total,
        computed=computed,
        local_cache=local_cache,
        from_tier=from_tier,
        hit_rate=round((local_cache + from_tier) / total, 4) if total else None,
        tier_payoff=round(from_tier / total, 4) if total else None,
    )


def fleet_split(splits: Sequence[SourceSplit]) -> SourceSplit:
    """The fleet's sum of per-instance splits."""
    return split_of(
        sum(s.computed for s in splits),
        sum(s.local_cache for s in splits),
        sum(s.from_tier for s in splits),
    )
