"""The fleet view's use cases, shared by the fleet_* tools and the `fleet` commands.

Each answer first asks each instance about itself, then folds the new events of every instance
that answered into the index (`FleetConnection.sync`), so what it says is as fresh as the feeds
allow; each instance's `freshness` says how fresh that is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import anyio
import anyio.to_thread
from pydantic import Field

from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection, InstanceProbe
from graph_kvcache_mcp.domain.fleet.findings import (
    InstanceFacts,
    pressure_ranking,
    sharing_findings,
)
from graph_kvcache_mcp.domain.fleet.freshness import Freshness, freshness_of
from graph_kvcache_mcp.domain.fleet.index import prompt_keys
from graph_kvcache_mcp.domain.fleet.kv_groups import groups_gap
from graph_kvcache_mcp.domain.fleet.memory import l1_pressure
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.hybrid.cache import is_hybrid_cache
from graph_kvcache_mcp.errors import VllmRequestError
from graph_kvcache_mcp.services.fleet.effectiveness import FleetCounters as FleetCounters
from graph_kvcache_mcp.services.fleet.effectiveness import counters as counters
from graph_kvcache_mcp.services.fleet.effectiveness import effectiveness as effectiveness
from graph_kvcache_mcp.services.fleet.memory import fleet_memory
from graph_kvcache_mcp.services.fleet.tiers import TierSources, with_tiers
from graph_kvcache_mcp.services.fleet.views import (
    CachedPrefix,
    FleetStatusOut,
    FleetWhereOut,
    IndexInfo,
    InstanceWhere,
)

HEAD_TOKENS = 24  # tokens of a cached prefix decoded for the listing
NO_TIER_VIEW = (
    "not checked: the fleet view indexes vLLM's own caches from their events; a shared tier "
    "(engine or LMCache) publishes none. fleet_effectiveness shows what the tier paid "
    "(from_tier)."
)


async def where_cached(
    conn: FleetConnection,
    *,
    request: Mapping[str, Any] | None = None,
    prompt: str | None = None,
    tiers: TierSources | None = None,
) -> FleetWhereOut:
    """Per instance, the prompt tokens its next request for `request` (a chat-completions body)
    or `prompt` (a completions prompt) would get from its prefix cache; with `tiers`, also from
    its LMCache server's tiers (`services.fleet.tiers`).

    Raises:
        ValueError: neither or both of request and prompt.
        VllmRequestError: an instance refused to tokenize the request.
    """
    if (request is None) == (prompt is None):
        raise ValueError("give exactly one of messages or prompt")
    probes = await _probe_then_sync(conn)
    now = time.time()
    answers: dict[str, InstanceWhere] = {}
    refusals: list[VllmRequestError] = []

    async def one(probe: InstanceProbe) -> None:
        try:
            answers[probe.name] = await _where_one(conn, probe, request, prompt, now)
        except VllmRequestError as exc:  # this instance refused the request: say so there
            refusals.append(exc)
            answers[probe.name] = InstanceWhere(
                name=probe.name,
                reachable=True,
                reason=f"it refused to tokenize the request: {exc}",
                trusted=False,
                freshness=_freshness(conn, probe, now),
            )

    async with anyio.create_task_group() as group:
        for probe in probes.values():
            group.start_soon(one, probe)
    if refusals and len(refusals) == sum(p.reachable for p in probes.values()):
        raise refusals[0]  # every instance that answers refused it: the request is bad
    instances = [answers[name] for name in conn.names]
    if tiers is not None:
        instances = await with_tiers(conn, tiers, instances, request=request, prompt=prompt)
    best, why = _best(instances, probes)
    return FleetWhereOut(
        reachable=any(i.reachable for i in instances),
        instances=instances,
        best=best,
        why=why,
        shared_tier=NO_TIER_VIEW,
        index=_index_info(conn),
    )


async def _where_one(
    conn: FleetConnection,
    probe: InstanceProbe,
    request: Mapping[str, Any] | None,
    prompt: str | None,
    now: float,
) -> InstanceWhere:
    fresh = _freshness(conn, probe, now)
    if not probe.reachable or probe.model is None:
        return InstanceWhere(
            name=probe.name,
            reachable=False,
            reason=probe.reason,
            trusted=False,
            freshness=fresh,
        )
    tokens = await conn.prompt_tokens(
        probe.name,
        probe.model,
        messages=None if request is None else list(request["messages"]),
        prompt=prompt,
    )
    if isinstance(tokens, Unavailable):
        return InstanceWhere(
            name=probe.name, reachable=False, reason=tokens.reason, trusted=False, freshness=fresh
        )
    config = probe.snapshot.cache_config if probe.snapshot else None
    block_size = config.block_size if config else None
    base = InstanceWhere(
        name=probe.name,
        reachable=True,
        prompt_tokens=len(tokens),
        block_size=block_size,
        trusted=fresh.state == "live",
        freshness=fresh,
    )
    if config is not None and config.enable_prefix_caching is False:
        return base.model_copy(update={"cached_tokens": 0, "held_tokens": 0})
    if block_size is None or probe.name not in conn.feeds:
        reason = "no kv_events feed" if probe.name not in conn.feeds else "block size unknown"
        return base.model_copy(update={"reason": reason})
    keys = prompt_keys(tokens, block_size, lookahead=conn.index.lookahead(probe.name))
    held = conn.index.match(probe.name, keys, block_size)
    update: dict[str, Any] = {
        "cached_tokens": held.served_tokens(len(tokens), block_size),
        "held_tokens": held.usable_tokens(block_size),
        "by_medium": held.by_medium,
    }
    hybrid = is_hybrid_cache(config.labels) if config else None
    gap = groups_gap(conn.index.groups(probe.name), hybrid=hybrid)
    if gap is not None:
        update |= {"trusted": False, "reason": gap}
    return base.model_copy(update=update)


def _best(
    instances: Sequence[InstanceWhere], probes: Mapping[str, InstanceProbe]
) -> tuple[str | None, str | None]:
    known = [i for i in instances if i.reachable and i.cached_tokens is not None]
    if not known:
        return None, None

    def load(item: InstanceWhere) -> tuple[int, float]:
        snap = probes[item.name].snapshot
        return (snap.requests_waiting or 0, snap.kv_cache_usage_perc or 0.0) if snap else (0, 0.0)

    top = max(i.cached_tokens or 0 for i in known)
    tied = sorted((i for i in known if (i.cached_tokens or 0) == top), key=load)
    best = tied[0]
    if top == 0:
        return best.name, f"no instance holds this prefix; {best.name} is the least loaded"
    why = f"{best.name} would serve {top} of {best.prompt_tokens} prompt tokens from its cache"
    if len(tied) > 1:
        why += f" (as would {', '.join(i.name for i in tied[1:])}; it is the least loaded)"
    return best.name, why


ListedPrefixes = Annotated[int, Field(ge=0, le=100)]
"""How many of the longest cached prefixes fleet_status lists."""


async def status(
    conn: FleetConnection, *, prefixes: int = 10, tiers: TierSources | None = None
) -> FleetStatusOut:
    """Every instance's facts, the findings, the pressure ranking and the longest prefixes; with
    `tiers`, also each LMCache server's L1 and the shared L2 (`services.fleet.memory`)."""
    probes = await _probe_then_sync(conn)
    now = time.time()
    facts = [_facts(conn, probe, now) for probe in probes.values()]
    memory = await fleet_memory(conn, tiers) if tiers is not None else None
    return FleetStatusOut(
        instances=facts,
        findings=sharing_findings(facts),
        pressure=pressure_ranking(facts, l1_pressure(memory)),
        prefixes=await _prefixes(conn, probes, prefixes),
        index=_index_info(conn),
        memory=memory,
    )


def _facts(conn: FleetConnection, probe: InstanceProbe, now: float) -> InstanceFacts:
    snap = probe.snapshot
    config = snap.cache_config if snap else None
    return InstanceFacts(
        name=probe.name,
        reachable=probe.reachable,
        reason=probe.reason,
        model=probe.model,
        version=probe.version,
        block_size=config.block_size if config else None,
        hash_algo=config.prefix_caching_hash_algo if config else None,
        prefix_caching=config.enable_prefix_caching if config else None,
        kv_usage=snap.kv_cache_usage_perc if snap else None,
        running=snap.requests_running if snap else None,
        waiting=snap.requests_waiting if snap else None,
        preemptions=probe.preemptions,
        blocks_indexed=conn.index.blocks_held(probe.name),
        feed=_freshness(conn, probe, now),
    )


async def _prefixes(
    conn: FleetConnection, probes: Mapping[str, InstanceProbe], limit: int
) -> list[CachedPrefix]:
    decoder = next((p for p in probes.values() if p.reachable and p.model), None)
    out: list[CachedPrefix] = []
    for chain, holders in conn.index.leaves(limit):
        tokens = [t for block in chain for t in block]
        head: str | None = None
        if decoder is not None and decoder.model is not None:
            text = await conn.clients[decoder.name].routes.detokenize(
                tokens[:HEAD_TOKENS], model=decoder.model
            )
            head = None if isinstance(text, Unavailable) else text
        out.append(
            CachedPrefix(
                tokens=len(tokens),
                head=head,
                holders={name: sorted(media) for name, media in sorted(holders.items())},
            )
        )
    return out


async def _probe_then_sync(conn: FleetConnection) -> dict[str, InstanceProbe]:
    """Every instance's probe, then the index brought up to date from the feeds of those that
    answered (an unreachable one's replay could only time out)."""
    probes = await conn.probe_all()
    await conn.sync(skip={name for name, probe in probes.items() if not probe.reachable})
    return probes


def _freshness(conn: FleetConnection, probe: InstanceProbe, now: float) -> Freshness:
    feed = conn.feeds.get(probe.name)
    if feed is None:
        return freshness_of(None, now=now, reachable=probe.reachable)
    return freshness_of(
        feed.tracker, now=now, reachable=probe.reachable, replay_error=feed.last_replay_error
    )


def _index_info(conn: FleetConnection) -> IndexInfo:
    return IndexInfo(
        blocks=len(conn.index),
        max_blocks=conn.index.max_blocks,
        forgotten=conn.index.forgotten,
    )
