"""The tiers behind each instance for fleet where: its LMCache server's L2 (the engine), checked
by the prompt's computed chunk keys and HEAD (exact, moves no counter), and what that adds to the
instance's next request.

An instance takes part when the fleet file names its LMCache server (`lmcache_http_url`) or it
is the managed vLLM on the managed `lmcache server`; the others keep today's vLLM-only answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.engine.opener import open_kv_client
from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection
from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp
from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls
from graph_kvcache_mcp.connectors.vllm.private_files import read_kv_identity
from graph_kvcache_mcp.domain.fleet.tier_trust import (
    Predecessor,
    l1_distrust,
    own_registration,
    predecessor_reason,
    unmanaged_distrust,
)
from graph_kvcache_mcp.domain.fleet.tiers import (
    ServerKeying,
    TierHeld,
    engine_connector_cached,
    leading_run,
    not_checked,
    total_cached,
)
from graph_kvcache_mcp.domain.lmcache.chunk_keys import (
    ChunkScheme,
    KeysUnknown,
    leading_tokens,
    prompt_chunk_keys,
)
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.outcomes import Presence, Unavailable
from graph_kvcache_mcp.domain.vllm.engine_kv.device import every_rank_keys, held_by_every_rank
from graph_kvcache_mcp.domain.vllm.kv_blocks import block_keys
from graph_kvcache_mcp.services.fleet.views import InstanceWhere
from graph_kvcache_mcp.services.stack.description import describe_stack
from graph_kvcache_mcp.services.stack.runtime import managed_coordinator_url

L2_SOURCE = "engine HEAD on computed chunk keys"
L1_SOURCE = "coordinator directory"
L1_NOT_CHECKED = (
    "not checked: L1 residency is read from an LMCache coordinator's directory; this server "
    "joined none and the fleet file names none (coordinator_url)"
)
ENGINE_CONNECTOR = "EngineKVConnector"
ENGINE_BLOCKS_SOURCE = "engine HEAD on EngineKVConnector's computed block keys"
HYBRID_NOT_CHECKED = (
    "not checked: a hybrid's hit also needs a stored Mamba state at a block boundary "
    "(EngineKVConnector's kept-state rule), which this view does not compute yet"
)


@dataclass(frozen=True)
class TierSources:
    """Where the tiers are: the engine and each instance's LMCache server."""

    settings: Settings

    def lmcache_url(self, conn: FleetConnection, name: str) -> str | None:
        """Its LMCache server's HTTP URL, `ENGINE_CONNECTOR` when it is the managed vLLM on
        EngineKVConnector, or None (no tier known: the answer stays vLLM's own)."""
        item = conn.fleet.instance(name)
        if (server := conn.fleet.lmcache_target(item)) is not None:  # named in the fleet file
            return server.url
        return _managed_target(self.settings, conn.fleet.vllm_target(item).url)

    def coordinator_distrust(self, coordinator_url: str) -> str | None:
        """Why a coordinator's L1 answers are not believed outright: None for the one this
        data dir started (behind our owner-only filter), or when the user trusts the others.
        Blocking (reads a state file)."""
        if self.settings.trust_unmanaged_coordinator:
            return None
        ours = managed_coordinator_url(self.settings.data_dir)
        if ours is not None and ours.rstrip("/") == coordinator_url.rstrip("/"):
            return None
        return unmanaged_distrust(coordinator_url)


async def server_counters(
    conn: FleetConnection, sources: TierSources
) -> dict[str, LmcacheCounters]:
    """Per instance, its LMCache server's lookup counters now, for each instance whose server
    serves no other instance of the fleet (a shared server's hits cannot be told apart by
    instance); absent for the others and for a server that did not answer."""
    urls: dict[str, str] = {}
    for name in conn.names:
        url = await anyio.to_thread.run_sync(sources.lmcache_url, conn, name)
        if url is not None and url != ENGINE_CONNECTOR:
            urls[name] = url.rstrip("/")
    alone = {name: url for name, url in urls.items() if list(urls.values()).count(url) == 1}
    read: dict[str, LmcacheCounters] = {}

    async def one(url: str) -> None:
        async with LmcacheHttp(url, tls=conn.tls) as server:
            counters = await server.counters()
        if not isinstance(counters, Unavailable):
            read[url] = counters

    async with anyio.create_task_group() as group:
        for url in alone.values():
            group.start_soon(one, url)
    return {name: read[url] for name, url in alone.items() if url in read}


def _managed_target(settings: Settings, base_url: str) -> str | None:
    """For the managed vLLM at `base_url`: the managed server's URL when it runs LMCache's MP
    connector, `ENGINE_CONNECTOR` on ours (read-only look at the state files)."""
    stack = describe_stack(settings.data_dir)
    if stack.vllm is None or stack.vllm.base_url.rstrip("/") != base_url.rstrip("/"):
        return None
    if stack.connector == ENGINE_CONNECTOR:
        return ENGINE_CONNECTOR
    server = stack.vllm_server
    return None if server is None else server.http_url


def _identity_file(settings: Settings) -> str | None:
    """Where the managed vLLM's EngineKVConnector publishes its KV identity."""
    vllm = describe_stack(settings.data_dir).vllm
    return None if vllm is None else vllm.wiring.identity_file


async def with_tiers(
    conn: FleetConnection,
    sources: TierSources,
    answers: Sequence[InstanceWhere],
    *,
    request: Mapping[str, Any] | None,
    prompt: str | None,
) -> list[InstanceWhere]:
    """`answers` with `tiers` (vllm, l1, l2) and the total `cached_tokens` for every instance
    that has an LMCache server; the others unchanged."""
    out = list(answers)
    targets = {
        index: url
        for index, item in enumerate(out)
        if item.reachable
        and (url := await anyio.to_thread.run_sync(sources.lmcache_url, conn, item.name))
    }
    if not targets:
        return out
    identity_file = None
    if ENGINE_CONNECTOR in targets.values():
        identity_file = await anyio.to_thread.run_sync(_identity_file, sources.settings)
    async with open_kv_client(_engine_settings(conn, sources.settings), tls=conn.tls) as kv:

        async def one(index: int, url: str) -> None:
            if url == ENGINE_CONNECTOR:
                out[index] = await _engine_connector_tiers(
                    conn, kv, out[index], identity_file, request, prompt
                )
            else:
                out[index] = await _tiers_one(conn, sources, kv, out[index], url, request, prompt)

        async with anyio.create_task_group() as group:
            for index, url in targets.items():
                group.start_soon(one, index, url)
    return out


def _engine_settings(conn: FleetConnection, settings: Settings) -> Settings:
    """The fleet file's engine when it names one, else the configured or managed engine."""
    fleet = conn.fleet
    if fleet.engine_url is None:
        return settings
    import os

    from pydantic import SecretStr

    token = os.environ.get(fleet.engine_token_env) if fleet.engine_token_env else None
    return settings.model_copy(
        update={"kv_url": fleet.engine_url, "kv_token": SecretStr(token) if token else None}
    )


async def _tiers_one(
    conn: FleetConnection,
    sources: TierSources,
    kv: KvClient,
    item: InstanceWhere,
    url: str,
    request: Mapping[str, Any] | None,
    prompt: str | None,
) -> InstanceWhere:
    vllm_tier = _vllm_tier(item)["vllm"]
    async with LmcacheHttp(url, tls=conn.tls) as server:
        keying = await server.keying()
    if isinstance(keying, Unavailable):
        down = f"unknown: {keying.reason}"
        tiers = {
            "vllm": vllm_tier,
            "l1": not_checked(down, source=L1_SOURCE),
            "l2": not_checked(down, source=L2_SOURCE),
        }
        return item.model_copy(update={"tiers": tiers})
    roots = await conn.clients[item.name].model_roots()
    tokens = await _tokens(conn, item.name, request, prompt)
    failed = next((r for r in (roots, tokens) if isinstance(r, Unavailable)), None)
    if failed is not None or isinstance(roots, Unavailable) or isinstance(tokens, Unavailable):
        why = f"unknown: {failed.reason if failed else 'no answer'}"
        l1 = not_checked(why, source=L1_SOURCE)
        l2 = not_checked(why, source=L2_SOURCE)
    else:
        model = next(iter(roots.values()), "")
        coordinator = conn.fleet.coordinator_url or keying.coordinator_url
        l2 = await l2_held(kv, tokens, keying, model=model)
        unmanaged = None
        if coordinator is not None:
            unmanaged = await anyio.to_thread.run_sync(sources.coordinator_distrust, coordinator)
        l1 = await l1_held(
            coordinator, url, tokens, keying, model=model, unmanaged=unmanaged, tls=conn.tls
        )
    tiers = {"vllm": vllm_tier, "l1": l1, "l2": l2}
    total = total_cached(
        item.cached_tokens,
        tiers,
        prompt_tokens=item.prompt_tokens or 0,
        chunk_size=keying.chunk_size,
    )
    trusted = item.trusted and l2.trusted and (l1.trusted or l1.tokens is None)
    return item.model_copy(update={"tiers": tiers, "cached_tokens": total, "trusted": trusted})


async def _engine_connector_tiers(
    conn: FleetConnection,
    kv: KvClient,
    item: InstanceWhere,
    identity_file: str | None,
    request: Mapping[str, Any] | None,
    prompt: str | None,
) -> InstanceWhere:
    """An instance on EngineKVConnector: its tier is the engine, under the block keys its
    published identity names (exact: HEAD moves none of the engine's read counters)."""
    tiers = _vllm_tier(item)
    record = await anyio.to_thread.run_sync(read_kv_identity, identity_file)
    if isinstance(record, str):
        tiers["l2"] = not_checked(f"not checked: {record}", source=ENGINE_BLOCKS_SOURCE)
        return item.model_copy(update={"tiers": tiers})
    if record.state_identity_digest is not None:
        tiers["l2"] = not_checked(HYBRID_NOT_CHECKED, source=ENGINE_BLOCKS_SOURCE)
        return item.model_copy(update={"tiers": tiers})
    tokens = await _tokens(conn, item.name, request, prompt)
    if isinstance(tokens, Unavailable):
        why = f"unknown: {tokens.reason}"
        tiers["l2"] = not_checked(why, source=ENGINE_BLOCKS_SOURCE)
        return item.model_copy(update={"tiers": tiers})
    salt = None if request is None else request.get("cache_salt")
    keys = block_keys(
        record.identity_digest, tokens, record.block_size, cache_salt=str(salt) if salt else None
    )
    present = await engine_blocks_held(kv, keys, record.tensor_parallel)
    if isinstance(present, Unavailable):
        tiers["l2"] = not_checked(f"unknown: {present.reason}", source=ENGINE_BLOCKS_SOURCE)
        return item.model_copy(update={"tiers": tiers})
    held = leading_run(present) * record.block_size
    tiers["l2"] = TierHeld(tokens=held, trusted=True, source=ENGINE_BLOCKS_SOURCE)
    total = engine_connector_cached(
        item.cached_tokens, present, prompt_tokens=len(tokens), block_size=record.block_size
    )
    return item.model_copy(update={"tiers": tiers, "cached_tokens": total})


async def engine_blocks_held(
    kv: KvClient, keys: Sequence[str], ranks: int
) -> list[bool] | Unavailable:
    """Per block of `keys`, whether the engine holds it: with tensor parallelism, every rank's
    key (as the connector's scheduler counts a hit), HEADed all at once."""
    asked = every_rank_keys(keys, ranks)
    found = await kv.contains_many(asked) if asked else []
    if down := next((f for f in found if isinstance(f, Unavailable)), None):
        return down
    return held_by_every_rank([isinstance(f, Presence) and f.present for f in found], ranks)


def _vllm_tier(item: InstanceWhere) -> dict[str, TierHeld]:
    reason = item.reason
    if reason is None and not item.trusted:
        reason = f"untrusted: the instance's event feed is {item.freshness.state}"
    held = TierHeld(
        tokens=item.held_tokens, trusted=item.trusted, source="KV-event index", reason=reason
    )
    return {"vllm": held}


async def _tokens(
    conn: FleetConnection,
    name: str,
    request: Mapping[str, Any] | None,
    prompt: str | None,
) -> list[int] | Unavailable:
    model = await conn.clients[name].resolve_model(None)
    if isinstance(model, Unavailable):
        return model
    messages = None if request is None else list(request["messages"])
    return await conn.prompt_tokens(name, model, messages=messages, prompt=prompt)


async def l2_held(
    kv: KvClient, tokens: Sequence[int], keying: ServerKeying, *, model: str
) -> TierHeld:
    """The leading prompt tokens whose chunks the engine holds under this server's keys."""
    if keying.engine_namespace is None:
        return TierHeld(
            tokens=0,
            trusted=True,
            source=L2_SOURCE,
            reason="the LMCache server has no engine L2 adapter",
        )
    scheme = ChunkScheme(
        model=model,
        chunk_size=keying.chunk_size,
        hash_algorithm=keying.hash_algorithm,
        namespace=keying.engine_namespace,
    )
    keys = prompt_chunk_keys(tokens, scheme)
    if isinstance(keys, KeysUnknown):
        return not_checked(f"unknown: {keys.reason}", source=L2_SOURCE)
    found = await kv.contains_many([key.engine_key for key in keys]) if keys else []
    if down := next((f for f in found if isinstance(f, Unavailable)), None):
        return not_checked(f"unknown: {down.reason}", source=L2_SOURCE)
    present = [isinstance(f, Presence) and f.present for f in found]
    return TierHeld(tokens=leading_tokens(keys, present), trusted=True, source=L2_SOURCE)


async def l1_held(
    coordinator_url: str | None,
    server_url: str,
    tokens: Sequence[int],
    keying: ServerKeying,
    *,
    model: str,
    unmanaged: str | None = None,
    tls: ClientTls | None = None,
) -> TierHeld:
    """The leading prompt tokens whose chunks the server holds in L1, from the coordinator's
    directory (events flush about every second: a store in the last second may be missing).
    `unmanaged`: why the coordinator is not believed outright (`coordinator_distrust`); `tls`:
    the fleet's mutual TLS, for a server and coordinator on other hosts."""
    if coordinator_url is None:
        return not_checked(L1_NOT_CHECKED, source=L1_SOURCE)
    parts = urlsplit(server_url)
    async with LmcacheHttp(server_url, tls=tls) as server:
        server_started = await server.started_s()
        reported = await server.instance_id()
    async with CoordinatorHttp(coordinator_url, tls=tls) as coordinator:
        found = await coordinator.registrations(parts.hostname or "", parts.port or 0)
        if isinstance(found, Unavailable):
            return not_checked(f"unknown: {found.reason}", source=L1_SOURCE)
        own = own_registration(found, server_started, reported)
        if own is None:
            return not_checked(
                f"not checked: the LMCache server at {server_url} is not registered with the "
                f"coordinator at {coordinator.url} (start it with --coordinator-url and "
                "--coordinator-event-reporting)",
                source=L1_SOURCE,
            )
        if isinstance(own, Predecessor):
            return not_checked(predecessor_reason(server_url, own), source=L1_SOURCE)
        chunks = await coordinator.l1_chunks(tokens, model=model, instance_id=own.instance_id)
        distrust = l1_distrust(await coordinator.started_s(), server_started) or unmanaged
    if isinstance(chunks, Unavailable):
        return not_checked(f"unknown: {chunks.reason}", source=L1_SOURCE)
    held = 0
    for here in chunks:
        if not here:
            break
        held += keying.chunk_size
    return TierHeld(tokens=held, trusted=distrust is None, source=L1_SOURCE, reason=distrust)
