"""Per-tier answers for one prompt on one instance, and what its next request gets in all.
Pure: no I/O.

An instance on LMCache's MP connector is served from vLLM's own prefix cache and, past that, from
its LMCache server: L1 (the server's memory) or L2 (the engine). LMCache looks up whole chunks of
the prompt without its last token (vLLM must compute that one), so the connector adds at most
`(prompt_tokens - 1) // chunk * chunk` tokens; vLLM takes the longer of its own hit and that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.lmcache.chunk_keys import DEFAULT_CHUNK_SIZE, SEED_FREE_HASH
from graph_kvcache_mcp.domain.lmcache.keys import DEFAULT_NAMESPACE

TierName = Literal["vllm", "l1", "l2"]
ENGINE_ADAPTER_MODULE = "graph_kvcache_mcp.plugins.lmcache.l2"


class TierHeld(BaseModel):
    """What one tier holds of the prompt."""

    model_config = ConfigDict(frozen=True)

    tokens: int | None = Field(
        None, description="Leading prompt tokens it holds; None: unknown (see reason)."
    )
    trusted: bool = Field(description="False: a guess (stale feed, unknown state).")
    source: str = Field(description="How it was read.")
    reason: str | None = None


def not_checked(reason: str, *, source: str) -> TierHeld:
    return TierHeld(tokens=None, trusted=False, source=source, reason=reason)


class ServerKeying(BaseModel):
    """What an `lmcache server`'s GET /config says about how it names chunks and where L2 is."""

    model_config = ConfigDict(frozen=True)

    chunk_size: int = DEFAULT_CHUNK_SIZE
    hash_algorithm: str = SEED_FREE_HASH
    engine_namespace: str | None = Field(
        None, description="Our engine adapter's key namespace; None: no engine L2 adapter."
    )
    coordinator_url: str | None = None
    resp_l2: bool = Field(
        False, description="L2 is LMCache's `resp` adapter (redis_resp): LMCache can delete there."
    )


def keying_from_config(config: Mapping[str, Any]) -> ServerKeying:
    """`ServerKeying` from the server's GET /config body (missing parts take LMCache's defaults)."""
    raw_mp = config.get("mp")
    mp: Mapping[str, Any] = raw_mp if isinstance(raw_mp, dict) else {}
    storage = config.get("storage_manager")
    adapters: list[Any] = []
    if isinstance(storage, dict) and isinstance(storage.get("l2_adapter_config"), dict):
        adapters = list(storage["l2_adapter_config"].get("adapters") or [])
    namespace = None
    resp = any(isinstance(a, dict) and a.get("type") == "resp" for a in adapters)
    for adapter in adapters:
        if isinstance(adapter, dict) and adapter.get("module_path") == ENGINE_ADAPTER_MODULE:
            params = adapter.get("adapter_params") or {}
            namespace = str(params.get("namespace") or DEFAULT_NAMESPACE)
            break
    coordinator = config.get("coordinator")
    url = coordinator.get("url") if isinstance(coordinator, dict) else None
    return ServerKeying(
        chunk_size=int(mp.get("chunk_size") or DEFAULT_CHUNK_SIZE),
        hash_algorithm=str(mp.get("hash_algorithm") or SEED_FREE_HASH),
        engine_namespace=namespace,
        coordinator_url=str(url) if url else None,
        resp_l2=resp,
    )


def connector_tokens(held: int, *, prompt_tokens: int, chunk_size: int) -> int:
    """What LMCache's MP connector adds for `held` leading tokens (never the last token).

    A prompt held whole (its length a whole number of chunks, every chunk held) is served but
    its last token, which vLLM computes: measured across hosts (`tools/bench_hosts.py
    --kv-connector mp_native`), 3,071 cached of 3,072-token prompts. Otherwise whole chunks."""
    last = max(prompt_tokens - 1, 0)
    if prompt_tokens % chunk_size == 0 and held >= prompt_tokens:
        return last  # its last chunk is full, so LMCache has it: vLLM recomputes one token
    return min(held, last // chunk_size * chunk_size)


def total_cached(
    vllm_tokens: int | None, tiers: Mapping[str, TierHeld], *, prompt_tokens: int, chunk_size: int
) -> int | None:
    """The next request's cached tokens in all: vLLM's own hit or the connector's, the longer.
    None when vLLM's own is unknown (a connector tier only lengthens it)."""
    if vllm_tokens is None:
        return None
    best = vllm_tokens
    for name in ("l1", "l2"):
        tier = tiers.get(name)
        if tier is not None and tier.tokens is not None:
            extra = connector_tokens(
                tier.tokens, prompt_tokens=prompt_tokens, chunk_size=chunk_size
            )
            best = max(best, extra)
    return best


def leading_run(present: Sequence[bool], start: int = 0, stop: int | None = None) -> int:
    """How many of `present[start:stop]`, from the first, are True."""
    run = 0
    for here in present[start:stop]:
        if not here:
            break
        run += 1
    return run


def engine_connector_cached(
    vllm_tokens: int | None, present: Sequence[bool], *, prompt_tokens: int, block_size: int
) -> int | None:
    """The next request's cached tokens on `EngineKVConnector`: vLLM's own hit, then the run
    of stored blocks right after it, as the connector looks them up (never the block holding
    the last prompt token, which vLLM must compute). `present[i]`: the engine holds block i.
    None when vLLM's own hit is unknown."""
    if vllm_tokens is None:
        return None
    start = vllm_tokens // block_size
    stop = max(prompt_tokens - 1, 0) // block_size
    return vllm_tokens + leading_run(present, start, stop) * block_size
