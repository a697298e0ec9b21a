"""Compile bundles through the KV store cache, read them back by key, and chat with one.

`compile_cached` looks the content-addressed key up *before* any scoring: a hit is decoded and
returned without scoring, MMR, budget fit or proof graph (`BundleCounters.assemblies` does not
move). A miss assembles and stores the bundle. The store being down never fails a compile: the
bundle comes back with `cache="unavailable"` and the reason. The bundle handed back on a miss is
the one decoded from the bytes just stored, so it renders exactly like a later hit.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.files.bundle_secret import bundle_secret
from graph_kvcache_mcp.domain.bundle import (
    DEFAULT_PREAMBLE,
    Bundle,
    BundleRequest,
    CacheState,
    CacheVerdict,
    ChatMessage,
    EstimateCounter,
    Lookup,
    PrecountedCounter,
    RejectedBundle,
    StoredState,
    StoreOff,
    TokenCounter,
    budget_parts,
    bundle_key,
    cache_verdict,
    compile_bundle,
    decode_bundle,
    encode_bundle,
    join_notes,
    needs_store,
)
from graph_kvcache_mcp.domain.outcomes import Hit, Miss, Unavailable
from graph_kvcache_mcp.domain.vllm.chat import DEFAULT_MAX_TOKENS
from graph_kvcache_mcp.domain.vllm.traces import Trace
from graph_kvcache_mcp.errors import InvalidValue, describe_validation

if TYPE_CHECKING:  # the vLLM client (and openai) load on first use, not with the server
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient


class ExactTokenCounter(Protocol):
    """A tokenizer reached over I/O (vLLM `/tokenize`): counts a batch, or says why it cannot."""

    @property
    def name(self) -> str: ...

    async def count_many(self, texts: Sequence[str]) -> list[int] | Unavailable: ...


@dataclass
class BundleCounters:
    """What this process's compiles did; `assemblies` is how often scoring actually ran."""

    assemblies: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_unavailable: int = 0
    rejected_entries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def count(self, verdict: CacheVerdict) -> None:
        """Move the counters the cache's verdict names (the one place a compile counts)."""
        self.add(**dict.fromkeys(verdict.counters, 1))


class CompileResult(BaseModel):
    """A compiled bundle and how the cache took part."""

    model_config = ConfigDict(frozen=True)

    bundle: Bundle
    cache: CacheState = Field(
        description="hit: served from the store; miss: assembled (and stored); unavailable: the "
        "store could not answer or store, bundle assembled anyway; off: no store used."
    )
    kv_cache_hit: bool
    assembled: bool = Field(description="True when scoring/MMR/budget/proof graph ran.")
    stored: StoredState | None = Field(
        None, description="What the store did with the new bundle, when it was put."
    )
    reason: str | None = Field(None, description="Why the cache could not serve or store.")
    lookup_ms: float | None = None
    assemble_ms: float | None = None
    total_ms: float


def make_request(query: str, items: Sequence[Any], **params: Any) -> BundleRequest:
    """A validated request from loose input (tool arguments, JSONL lines, flags).

    Raises:
        InvalidValue: names each field that is wrong and why.
    """
    try:
        return BundleRequest.model_validate(
            {
                "query": query,
                "items": list(items),
                "params": {k: v for k, v in params.items() if v is not None},
            }
        )
    except ValidationError as exc:
        problems = describe_validation(exc, whole="request")
        raise InvalidValue(f"invalid bundle request ({problems})") from None


def secret_of(settings: Settings) -> bytes:
    """The key that signs stored bundles: `GRAPH_KVCACHE_BUNDLE_SECRET`, else the data dir's
    own (`connectors/files/bundle_secret.py`), so a forged envelope never reads as a hit.

    Raises:
        ConfigError: the data dir's secret file cannot be used (it says why and how to fix it).
    """
    return bundle_secret(settings)


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


async def _counter_for(
    request: BundleRequest, exact: ExactTokenCounter | None, fallback: TokenCounter
) -> tuple[TokenCounter, str | None]:
    """A counter the pure compile can use: an exact one is asked for every part up front."""
    if exact is None:
        return fallback, None
    parts = budget_parts(request)
    counts = await exact.count_many(parts)
    if isinstance(counts, Unavailable):
        return fallback, _unavailable_note(counts, fallback)
    return PrecountedCounter(exact.name, dict(zip(parts, counts, strict=True))), None


async def compile_cached(
    request: BundleRequest,
    *,
    kv: KvClient | Unavailable | None,
    counter: TokenCounter | None = None,
    exact: ExactTokenCounter | Unavailable | None = None,
    secret: bytes | None = None,
    counters: BundleCounters | None = None,
) -> CompileResult:
    """The bundle for `request`, from the store when it has it, else assembled and stored.

    `kv` is the store's client, `Unavailable` when it could not be reached (the bundle is then
    assembled and the reason reported), or None for no cache at all.

    `exact` (a tokenizer over I/O) wins over `counter` when given; it is only asked on a miss,
    and when it cannot answer (or is `Unavailable` from the start) the compile falls back to
    `counter` (default: the estimate) and says so in `reason`.
    """
    started = time.perf_counter()
    counters = counters if counters is not None else BundleCounters()
    sizing = _Sizing.of(exact, counter or EstimateCounter())
    lookup, lookup_ms = await _look_up(request, kv, sizing, secret)
    if isinstance(lookup, Bundle):
        verdict = cache_verdict(lookup, None)
        counters.count(verdict)
        return CompileResult(
            bundle=lookup,
            cache=verdict.cache,
            kv_cache_hit=True,
            assembled=False,
            lookup_ms=lookup_ms,
            total_ms=_ms(started),
        )
    built = await _assemble(request, sizing, secret, counters)
    put = await kv.put(built.bundle.key, built.blob) if _reached(kv, lookup) else None
    verdict = cache_verdict(lookup, put)
    counters.count(verdict)
    return built.result(verdict, started=started, lookup_ms=lookup_ms)


async def _look_up(
    request: BundleRequest, kv: KvClient | Unavailable | None, sizing: _Sizing, secret: bytes | None
) -> tuple[Lookup, float | None]:
    """What the store holds under the request's key, decoded, and how long asking took."""
    if kv is None:
        return StoreOff(), None
    if isinstance(kv, Unavailable):
        return kv, None
    key = bundle_key(request, token_counter=sizing.name, secret=secret)
    lookup_started = time.perf_counter()
    found = await kv.get(key)
    lookup_ms = _ms(lookup_started)
    if isinstance(found, Hit):
        return decode_bundle(found.value, expected_key=key, secret=secret), lookup_ms
    return found, lookup_ms


def _reached(kv: KvClient | Unavailable | None, lookup: Lookup) -> TypeGuard[KvClient]:
    """Whether the new bundle is put: the lookup reached `kv` and found nothing usable."""
    return kv is not None and not isinstance(kv, Unavailable) and needs_store(lookup)


def _unavailable_note(exact: Unavailable, fallback: TokenCounter) -> str:
    return f"exact token count unavailable ({exact.reason}); fitted with {fallback.name}"


@dataclass(frozen=True)
class _Sizing:
    exact: ExactTokenCounter | None
    fallback: TokenCounter
    note: str | None = None

    @classmethod
    def of(cls, exact: ExactTokenCounter | Unavailable | None, fallback: TokenCounter) -> _Sizing:
        if isinstance(exact, Unavailable):
            return cls(None, fallback, _unavailable_note(exact, fallback))
        return cls(exact, fallback)

    @property
    def name(self) -> str:
        return self.exact.name if self.exact is not None else self.fallback.name


@dataclass(frozen=True)
class _Built:
    """A freshly assembled bundle, in its stored form, with the bytes to store."""

    bundle: Bundle
    blob: bytes
    assemble_ms: float
    note: str | None

    def result(
        self, verdict: CacheVerdict, *, started: float, lookup_ms: float | None
    ) -> CompileResult:
        return CompileResult(
            bundle=self.bundle,
            cache=verdict.cache,
            kv_cache_hit=False,
            assembled=True,
            stored=verdict.stored,
            reason=join_notes(verdict.reason, self.note),
            lookup_ms=lookup_ms,
            assemble_ms=self.assemble_ms,
            total_ms=_ms(started),
        )


async def _assemble(
    request: BundleRequest, sizing: _Sizing, secret: bytes | None, counters: BundleCounters
) -> _Built:
    started = time.perf_counter()
    usable, note = await _counter_for(request, sizing.exact, sizing.fallback)
    note = note or sizing.note
    counters.add(assemblies=1)
    # Scoring is CPU work (milliseconds for hundreds of items): keep it off the event loop.
    bundle = await anyio.to_thread.run_sync(
        lambda: compile_bundle(request, counter=usable, secret=secret)
    )
    blob = encode_bundle(bundle, secret=secret)
    # Hand back what the bytes decode to, so this render and every later hit's agree.
    stored_form = decode_bundle(blob, expected_key=bundle.key, secret=secret)
    if not isinstance(stored_form, Bundle):  # a bug in the codec, never a caller mistake
        raise RuntimeError(f"a fresh bundle did not survive its own encoding: {stored_form}")
    return _Built(stored_form, blob, _ms(started), note)


async def load_bundle(
    kv: KvClient, key: str, *, secret: bytes | None = None
) -> Bundle | Miss | RejectedBundle | Unavailable:
    """The bundle stored under `key`: `Miss` when absent, `RejectedBundle` when unusable."""
    found = await kv.get(key)
    match found:
        case Hit(value):
            return decode_bundle(value, expected_key=key, secret=secret)
        case Miss() | Unavailable():
            return found


class BundleChat(BaseModel):
    """The model's answer over a bundle, and the call's prefix-cache accounting."""

    model_config = ConfigDict(frozen=True)

    answer: str
    trace: Trace
    system_sha256: str = Field(description="SHA-256 of the system message sent (the prefix).")
    messages: int = Field(description="How many messages were sent.")


async def bundle_chat(
    client: VllmClient,
    bundle: Bundle,
    turn_text: str,
    *,
    model: str | None = None,
    system_preamble: str = DEFAULT_PREAMBLE,
    history: Sequence[ChatMessage] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    stream: bool = False,
) -> BundleChat | Unavailable:
    """Render `bundle` for this turn and send it to vLLM; the Trace says what was cached.

    Raises:
        InvalidValue: history holds a system message (the bundle's comes first).
        VllmRequestError: vLLM refused the request (unknown model, prompt too long, ...).
    """
    try:
        messages = bundle.as_prompt_messages(
            turn_text, system_preamble=system_preamble, history=history
        )
    except ValueError as exc:  # only the render's own check; vLLM's refusals are not caught here
        raise InvalidValue(str(exc)) from None
    result = await client.chat(
        messages,
        model=model,
        max_tokens=max_tokens,
        stream=stream,
    )
    if isinstance(result, Unavailable):
        return result
    system = messages[0].content.encode("utf-8")
    return BundleChat(
        answer=result.answer,
        trace=result.trace,
        system_sha256=hashlib.sha256(system).hexdigest(),
        messages=len(messages),
    )
