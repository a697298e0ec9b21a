"""cache_warm, cache_evict, cache_pin / cache_unpin: one prompt's chunks on one instance's LMCache
server, through the coordinator that server joined (or the fleet file's `coordinator_url`).

What they really do with the engine as L2 (lmcache 0.5.6, measured): a warm copies the chunks
from the engine into the server's L1; an L1 evict removes L1 copies; no L2 delete is sent, and
the managed server's admin filter serves only an unforced L1 delete. Whether anything else can
delete from the engine depends on the mode: with our `native_plugin` adapter nothing can (it has
no delete, the engine no DELETE route); in `redis_resp` LMCache's `resp` adapter can (its own L2
eviction does). Pins are coordinator bookkeeping for L2 only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio
from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection
from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp
from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.versions import LMCACHE_VERSION
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.services.fleet.tiers import TierSources

L2_KEPT = (
    "the engine keeps every chunk stored in L2: the coordinator's L2 delete cannot remove it "
    "(our adapter has no delete and the engine no DELETE route), so L2 was not touched"
)
L2_RESP = (
    "L2 was not touched: this tool sends no L2 delete, and the lmcache server's admin filter "
    "refuses one. But in redis_resp mode L2 is the engine's RESP store through LMCache's "
    "`resp` adapter, which CAN delete engine data (LMCache's own L2 eviction does)"
)
PIN_NOTE = (
    "LMCache pins are coordinator bookkeeping for L2 keys: they hold keys back from non-forced "
    "coordinator deletes and quota eviction; they do not keep chunks in any server's L1 "
    f"({LMCACHE_VERSION} has no L1 pin), do not stop the engine's own retention, and accept "
    "keys never stored"
)
WARM_POLL_S = 0.1


@dataclass(frozen=True)
class CacheTarget:
    """One prompt on one instance's server, as the coordinator names it."""

    coordinator: str
    instance_id: str
    model: str
    token_ids: list[int]
    resp_l2: bool = False
    """L2 is LMCache's `resp` adapter (redis_resp): LMCache itself can delete there."""
    tls: ClientTls | None = None
    """The fleet's mutual TLS, for a coordinator on another host."""

    def body(self, **extra: Any) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "model_name": self.model,
            "world_size": 1,
            "token_ids": self.token_ids,
            "cache_salt": "",
            **extra,
        }


class CacheOut(BaseModel):
    """What a cache_* call did."""

    model_config = ConfigDict(frozen=True)

    instance: str
    done: bool = Field(description="True only when the action took effect as reported.")
    reason: str | None = Field(None, description="Why not, or what did not happen.")
    chunks: int | None = Field(None, description="Whole chunks of the prompt.")
    found: int | None = Field(None, description="Warm: chunks found in L2 and loaded into L1.")
    affected: int | None = Field(None, description="Evict/pin: keys the action changed.")
    note: str | None = Field(None, description="What the action does and does not protect.")


async def resolve_target(
    conn: FleetConnection,
    sources: TierSources,
    name: str,
    *,
    request: Mapping[str, Any] | None,
    prompt: str | None,
) -> CacheTarget | Unavailable:
    """The coordinator, the server's instance id, vLLM's model and the prompt's token ids.

    Raises:
        ConfigError: no instance `name`, or it has no LMCache server.
        VllmRequestError: the instance refused to tokenize the request.
    """
    conn.fleet.instance(name)  # raises for an unknown name
    url = await anyio.to_thread.run_sync(sources.lmcache_url, conn, name)
    if url is None or not url.startswith("http"):
        raise ConfigError(
            f"instance {name!r} has no LMCache server to steer: name it in the fleet file "
            "(lmcache_http_url) or start the managed stack (vllm_start kv_connector=mp_native)"
        )
    async with LmcacheHttp(url, tls=conn.tls) as server:
        keying = await server.keying()
        reported = await server.instance_id()
    if isinstance(keying, Unavailable):
        return keying
    coordinator_url = conn.fleet.coordinator_url or keying.coordinator_url
    if coordinator_url is None:
        return Unavailable(
            f"the LMCache server at {url} joined no coordinator and the fleet file names none "
            "(coordinator_url): warm, evict and pin go through one"
        )
    client = conn.clients[name]
    roots = await client.model_roots()
    if isinstance(roots, Unavailable):
        return roots
    served = next(iter(roots))
    messages = None if request is None else list(request["messages"])
    tokens = await conn.prompt_tokens(name, served, messages=messages, prompt=prompt)
    if isinstance(tokens, Unavailable):
        return tokens
    parts = urlsplit(url)
    async with CoordinatorHttp(coordinator_url, tls=conn.tls) as coordinator:
        instance = await coordinator.instance_id(
            parts.hostname or "", parts.port or 0, reported=reported
        )
    if isinstance(instance, Unavailable):
        return instance
    if instance is None:
        return Unavailable(
            f"the LMCache server at {url} is not registered with the coordinator at "
            f"{coordinator_url}; start it with --coordinator-url and --coordinator-event-reporting"
        )
    return CacheTarget(
        coordinator_url,
        instance,
        roots[served],
        list(tokens),
        resp_l2=keying.resp_l2,
        tls=conn.tls,
    )


async def warm(name: str, target: CacheTarget, *, timeout_s: float) -> CacheOut:
    """Prefetch the prompt's chunks from L2 into the server's L1 and wait for the job."""
    async with CoordinatorHttp(target.coordinator, tls=target.tls) as coordinator:
        job = await coordinator.prefetch(target.body())
        if isinstance(job, Unavailable):
            return CacheOut(instance=name, done=False, reason=job.reason)
        chunks = int(job.get("chunks") or 0)
        if job.get("status") != "submitted":
            return CacheOut(
                instance=name, done=True, chunks=chunks, found=0, reason="shorter than one chunk"
            )
        request_id = str(job.get("request_id"))
        with anyio.move_on_after(timeout_s):
            while True:
                state = await coordinator.prefetch_state(target.instance_id, request_id)
                if isinstance(state, Unavailable):
                    return CacheOut(instance=name, done=False, chunks=chunks, reason=state.reason)
                if state.get("status") == "completed":
                    found = int(state.get("found_keys") or 0)
                    total = int(state.get("total_keys") or chunks)
                    return CacheOut(
                        instance=name,
                        done=True,
                        chunks=total,
                        found=found,
                        reason=None if found == total else "the rest is not in L2",
                    )
                await anyio.sleep(WARM_POLL_S)
    return CacheOut(
        instance=name,
        done=False,
        chunks=chunks,
        reason=f"the warm did not complete within {timeout_s:g} s (it may still finish)",
    )


async def evict(name: str, target: CacheTarget, *, tier: Literal["l1", "l2"]) -> CacheOut:
    """Remove the prompt's chunks from the server's L1; for L2, delete nothing and say what,
    in this mode, can delete there."""
    if tier == "l2":
        return CacheOut(instance=name, done=False, reason=L2_RESP if target.resp_l2 else L2_KEPT)
    async with CoordinatorHttp(target.coordinator, tls=target.tls) as coordinator:
        answer = await coordinator.delete(target.body(tier="l1", force=False))
    if isinstance(answer, Unavailable):
        return CacheOut(instance=name, done=False, reason=answer.reason)
    skipped = int(answer.get("skipped") or 0)
    return CacheOut(
        instance=name,
        done=True,
        chunks=int(answer.get("requested") or 0),
        affected=int(answer.get("affected") or 0),
        reason=f"{skipped} chunks were in use and kept" if skipped else None,
        note="L1 only; " + (L2_RESP if target.resp_l2 else L2_KEPT),
    )


async def pin(name: str, target: CacheTarget, *, on: bool) -> CacheOut:
    """Pin (or unpin) the prompt's L2 keys in the coordinator's bookkeeping."""
    body = {k: v for k, v in target.body().items() if k != "instance_id"}
    async with CoordinatorHttp(target.coordinator, tls=target.tls) as coordinator:
        answer = await coordinator.pins(body, pin=on)
    if isinstance(answer, Unavailable):
        return CacheOut(instance=name, done=False, reason=answer.reason, note=PIN_NOTE)
    return CacheOut(
        instance=name,
        done=True,
        chunks=int(answer.get("requested") or 0),
        affected=int(answer.get("affected") or 0),
        note=PIN_NOTE,
    )
