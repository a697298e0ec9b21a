"""diagnose_miss across tiers: for the instance the tools talk to, what its next request for a
prompt gets from vLLM's own cache, its LMCache server's L1 and the engine (L2), and why not more.

The tiers are read as `fleet where` reads them (`services.fleet.tiers`); this adds the facts that
explain a miss (the coordinator's whole directory answer, the server's miss counters, vLLM's own
counters) and hands them to the pure rules in `domain.diagnosis.tier_miss`. Its LMCache server is
the fleet file's, else the configured one (`GRAPH_KVCACHE_LMCACHE_URL`), else the managed one
behind the managed vLLM; PYTHONHASHSEED is compared only for the processes this data dir
started (another's environment is not readable here). An instance with no LMCache server gets
no tier answer (None): its misses are vLLM's alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.diagnosis.tier_facts import (
    DirectoryFacts,
    ServerCounters,
    TierFacts,
    directory_facts,
    parse_server_counters,
)
from graph_kvcache_mcp.domain.diagnosis.tier_miss import TierMiss, explain_tiers
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet, FleetInstance
from graph_kvcache_mcp.domain.fleet.tiers import ServerKeying
from graph_kvcache_mcp.domain.lmcache.chunk_keys import SEED_FREE_HASH, chunk_hashes
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.targets import Configured
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.services.fleet.operations import where_cached
from graph_kvcache_mcp.services.fleet.tiers import ENGINE_CONNECTOR, TierSources
from graph_kvcache_mcp.services.fleet.views import InstanceWhere
from graph_kvcache_mcp.services.stack.runtime import (
    lmcache_target,
    managed_lmcache_runtime,
    managed_vllm_runtime,
)

if TYPE_CHECKING:  # zmq and openai load with the first call
    from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection

THIS = "this"


async def tier_miss(
    settings: Settings, base_url: str, request: Mapping[str, Any]
) -> TierMiss | None:
    """Per tier, what the next request for `request` (a chat body) gets on the vLLM at
    `base_url` and why not more; None when that vLLM has no LMCache server we know of.

    Raises:
        VllmRequestError: vLLM refused to tokenize the request.
    """
    from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection

    fleet = await anyio.to_thread.run_sync(_fleet_of, settings, base_url)
    conn = FleetConnection(fleet, timeout_s=settings.vllm_timeout_s)
    try:
        sources = TierSources(settings)
        url = await anyio.to_thread.run_sync(sources.lmcache_url, conn, THIS)
        if url is None or url == ENGINE_CONNECTOR:
            return None
        where = (await where_cached(conn, request=request, tiers=sources)).instances[0]
        if not where.reachable or where.prompt_tokens is None or not where.tiers:
            return None
        facts = await _facts(settings, conn, url, request, where)
    finally:
        await conn.aclose()
    return explain_tiers(facts, lmcache_url=url)


def _fleet_of(settings: Settings, base_url: str) -> Fleet:
    """A fleet of one: the instance at `base_url` as the fleet file (or the managed vLLM with
    events) describes it, else bare, its lmcache server the configured one when the file names
    none; the file's engine and coordinator kept."""
    from graph_kvcache_mcp.connectors.fleet.connection import load_fleet

    try:
        fleet: Fleet | None = load_fleet(settings)
    except ConfigError:
        fleet = None
    same = [
        item
        for item in (fleet.instances if fleet else ())
        if item.base_url.rstrip("/") == base_url.rstrip("/")
    ]
    chosen = (same[0] if same else FleetInstance(name=THIS, base_url=base_url)).model_copy(
        update={"name": THIS}
    )
    server = lmcache_target(settings)
    if chosen.lmcache_http_url is None and isinstance(server, Configured):  # the file wins
        chosen = chosen.model_copy(update={"lmcache_http_url": server.url})
    if fleet is None:
        return Fleet(instances=(chosen,))
    return fleet.model_copy(update={"instances": (chosen,)})


async def _facts(
    settings: Settings,
    conn: FleetConnection,
    url: str,
    request: Mapping[str, Any],
    where: InstanceWhere,
) -> TierFacts:
    from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp

    client = conn.clients[THIS]
    async with LmcacheHttp(url) as server:
        keying = await server.keying()
        text = await server.metrics_text()
    counters = None if isinstance(text, Unavailable) else parse_server_counters(text)
    known = not isinstance(keying, Unavailable)
    keying = keying if not isinstance(keying, Unavailable) else ServerKeying()
    model = await client.resolve_model(None)
    snapshot = None if isinstance(model, Unavailable) else await client.metrics.snapshot(model)
    counted = usage = None
    if snapshot is not None and not isinstance(snapshot, Unavailable):
        counted, usage = snapshot.prompt_tokens, snapshot.kv_cache_usage_perc
    facts = TierFacts(
        prompt_tokens=where.prompt_tokens or 0,
        block_size=where.block_size if known else None,  # no chunk size to compare it to
        chunk_size=keying.chunk_size,
        hash_algorithm=keying.hash_algorithm,
        tiers=where.tiers or {},
        vllm_counted_prompt_tokens=counted,
        vllm_feed_resets=where.freshness.resets if where.freshness else 0,
        vllm_kv_usage=usage,
        counters=counters or ServerCounters(),
    )
    if keying.hash_algorithm != SEED_FREE_HASH:
        seeds = await anyio.to_thread.run_sync(_hash_seeds, settings, client.base_url, url)
        facts = facts.model_copy(update={"hash_seeds": seeds})
    if isinstance(model, Unavailable):
        return facts
    tokens = await conn.prompt_tokens(THIS, model, messages=list(request["messages"]), prompt=None)
    roots = await client.model_roots()
    coordinator = conn.fleet.coordinator_url or keying.coordinator_url
    if isinstance(tokens, Unavailable) or isinstance(roots, Unavailable) or coordinator is None:
        return facts
    root = next(iter(roots.values()), model)
    directory = await _directory(coordinator, url, tokens, root)
    expected = None
    if keying.hash_algorithm == SEED_FREE_HASH:
        expected = [h.hex() for h in chunk_hashes(tokens, chunk_size=keying.chunk_size)]
    return facts.model_copy(update={"directory": directory, "expected_hashes": expected})


def _hash_seeds(settings: Settings, base_url: str, server_url: str) -> dict[str, str | None]:
    """PYTHONHASHSEED of the managed vLLM at `base_url` and the managed server at `server_url`,
    where they are ours to read (another process's environment is not)."""
    seeds: dict[str, str | None] = {}
    vllm = managed_vllm_runtime(settings.data_dir)
    if vllm is not None and vllm.base_url.rstrip("/") == base_url.rstrip("/"):
        seeds["vllm"] = vllm.hash_seed
    server = managed_lmcache_runtime(settings.data_dir, server_url)
    if server is not None:
        seeds["server"] = server.hash_seed
    return seeds


async def _directory(
    coordinator_url: str, server_url: str, tokens: list[int], model: str
) -> DirectoryFacts | None:
    from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp
    from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp

    parts = urlsplit(server_url)
    async with LmcacheHttp(server_url) as server:
        reported = await server.instance_id()
    async with CoordinatorHttp(coordinator_url) as coordinator:
        this = await coordinator.instance_id(
            parts.hostname or "", parts.port or 0, reported=reported
        )
        lookup = await coordinator.lookup(tokens, model=model)
        instances = await coordinator.instances()
    if isinstance(lookup, Unavailable) or isinstance(instances, Unavailable):
        return None
    return directory_facts(lookup, instances, this_instance=this if isinstance(this, str) else None)
