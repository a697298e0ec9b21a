"""`diagnose miss`: why the second of two chat requests missed vLLM's prefix cache.

Both requests are tokenized by the server itself (its chat template, generation prompt added),
compared token by token, and the cause named; with `verify` both are then sent, one right after
the other, and the cached tokens vLLM reports stand next to the prediction. Shared by the
`diagnose_miss` tool and the `diagnose miss` CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graph_kvcache_mcp.connectors.vllm.routes import ChatTokens
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.diagnosis.hybrid_miss import hybrid_cause
from graph_kvcache_mcp.domain.diagnosis.prefix_diff import (
    Cause,
    Divergence,
    classify,
    common_prefix,
    first_different_message,
    first_divergent_token,
    predicted_cached_tokens,
    role_at,
)
from graph_kvcache_mcp.domain.diagnosis.tier_miss import TierMiss, salt_mismatch
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.hybrid.cache import (
    hybrid_cached_tokens,
    keeps_state_at_prefill_end_only,
)
from graph_kvcache_mcp.errors import ConfigError, describe_validation

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    from graph_kvcache_mcp.config import Settings
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient

EXCERPT_BEFORE, EXCERPT_AFTER = 6, 10  # tokens decoded around the divergence
VERIFY_MAX_TOKENS = 1


class ChatTokenizer(Protocol):
    """vLLM's own tokenization (`VllmRoutes`) or a local tokenizer dir (`LocalChatTokenizer`)."""

    async def tokenize_chat(
        self, request: Mapping[str, Any], *, model: str
    ) -> ChatTokens | Unavailable: ...

    async def detokenize(self, tokens: Sequence[int], *, model: str) -> str | Unavailable: ...


class MissVerification(BaseModel):
    """What vLLM reported when both requests were sent, one right after the other."""

    model_config = ConfigDict(frozen=True)

    first_cached_tokens: int | None
    cached_tokens: int | None = Field(description="The second request's cached prompt tokens.")
    cached_tokens_source: str = Field(description="usage, metrics_delta or unavailable.")
    matches_prediction: bool | None = Field(description="None when vLLM could not tell.")
    note: str | None = None


class MissDiagnosis(BaseModel):
    """Tool and CLI output of diagnose_miss."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    reason: str | None = None
    model: str | None = None
    block_size: int | None = None
    block_size_source: Literal["given", "cache_config_info"] | None = None
    tokenizer: Literal["vllm", "local"] | None = Field(
        None, description="vllm: the server's /tokenize; local: a tokenizer dir (no vLLM)."
    )
    first_tokens: int | None = None
    second_tokens: int | None = None
    common_prefix_tokens: int | None = None
    first_divergent_token: int | None = None
    predicted_cached_tokens: int | None = Field(
        None,
        description="floor(min(common, second_tokens - 1) / block_size) * block_size; a "
        "hybrid: the first's last full block if within that, else 0",
    )
    divergence: Divergence | None = None
    cause: Cause | None = None
    verification: MissVerification | None = None
    tiers: TierMiss | None = Field(
        None,
        description="With an LMCache server: the second request per tier (vLLM, L1, L2) as it "
        "stands before verify, what each serves and why the rest missed.",
    )


def chat_messages(request: Mapping[str, Any], which: str) -> list[dict[str, Any]]:
    """The `messages` of a chat-completions body, checked.

    Raises:
        ConfigError: no non-empty `messages` list of objects with a `role`.
    """
    messages = request.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise ConfigError(
            f"{which} is not a chat-completions body: give an object with a non-empty "
            '"messages" list of {"role": ..., "content": ...} objects'
        )
    return cast(list[dict[str, Any]], messages)


async def explain_miss(
    client: VllmClient | None,
    tokenizer: ChatTokenizer,
    first: Mapping[str, Any],
    second: Mapping[str, Any],
    *,
    model: str | None = None,
    block_size: int | None = None,
    verify: bool = False,
    hybrid: bool = False,
    settings: Settings | None = None,
) -> MissDiagnosis:
    """Compare two chat requests as vLLM tokenizes them and say why the second misses. Without a
    `client` (a local tokenizer, no vLLM) `block_size` is required, nothing is verified, and
    `hybrid` says whether the model keeps mamba state (vLLM's cache config says so otherwise).
    With `settings` the second request is also explained tier by tier (`tiers`) when this vLLM
    has an LMCache server, as it stands before verify sends anything.

    Raises:
        ConfigError: a body without messages, a bad or missing block size, verify without
            vLLM, or a server that does not report its block size (pass block_size).
        VllmRequestError: vLLM refused a request.
    """
    first_messages = chat_messages(first, "first")
    second_messages = chat_messages(second, "second")
    if block_size is not None and block_size <= 0:
        raise ConfigError(f"block_size is {block_size}: give the server's block size in tokens")
    if client is None:
        if block_size is None or verify:
            raise ConfigError(
                "with a local tokenizer give the block size (vLLM's --block-size) and no "
                "verify: both need a running vLLM"
            )
        return await _compare(
            tokenizer, first, second, (first_messages, second_messages),
            model=model or "local", block_size=block_size, source="given", local=True,
            hybrid=hybrid,
        )  # fmt: skip
    named = [m for m in (model, first.get("model"), second.get("model")) if isinstance(m, str)]
    chosen = await client.resolve_model(named[0] if named else None)
    if isinstance(chosen, Unavailable):
        return MissDiagnosis(reachable=False, reason=chosen.reason)
    source: Literal["given", "cache_config_info"] = "given"
    served = await _served_cache(client, chosen, need_block_size=block_size is None)
    if isinstance(served, Unavailable):
        return MissDiagnosis(reachable=False, reason=served.reason, model=chosen)
    served_block, hybrid = served
    if block_size is None:
        block_size, source = served_block, "cache_config_info"
    assert block_size is not None  # _served_cache raises when it was needed and is missing
    out = await _compare(
        tokenizer, first, second, (first_messages, second_messages),
        model=chosen, block_size=block_size, source=source, local=False, hybrid=hybrid,
    )  # fmt: skip
    if settings is not None and out.reachable:
        out = await _with_tiers(out, settings, client.base_url, first, second)
    if not verify or not out.reachable or out.predicted_cached_tokens is None:
        return out
    verification = await _verify(
        client, chosen, first_messages, second_messages, out.predicted_cached_tokens
    )
    if isinstance(verification, Unavailable):
        return MissDiagnosis(reachable=False, reason=verification.reason, model=chosen)
    if _extras(first) or _extras(second):
        verification = verification.model_copy(
            update={"note": "verify sends the messages only (no tools or template fields)"}
        )
    return out.model_copy(update={"verification": verification})


async def _with_tiers(
    out: MissDiagnosis,
    settings: Settings,
    base_url: str,
    first: Mapping[str, Any],
    second: Mapping[str, Any],
) -> MissDiagnosis:
    from graph_kvcache_mcp.services.diagnosis.tier_miss import tier_miss

    tiers = await tier_miss(settings, base_url, second)
    if tiers is None:
        return out
    salt = salt_mismatch(first.get("cache_salt"), second.get("cache_salt"))
    if salt is not None:
        tiers = tiers.model_copy(update={"mismatches": [*tiers.mismatches, salt]})
    return out.model_copy(update={"tiers": tiers})


async def _compare(
    tokenizer: ChatTokenizer,
    first: Mapping[str, Any],
    second: Mapping[str, Any],
    messages: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    *,
    model: str,
    block_size: int,
    source: Literal["given", "cache_config_info"],
    local: bool,
    hybrid: bool = False,
) -> MissDiagnosis:
    """Tokenize both, find where they part, predict and classify (nothing sent to the model)."""
    chosen = model
    first_messages, second_messages = messages
    tokenized: list[ChatTokens] = []
    for request in (first, second):
        tokens = await tokenizer.tokenize_chat(request, model=chosen)
        if isinstance(tokens, Unavailable):
            return MissDiagnosis(reachable=False, reason=tokens.reason, model=chosen)
        tokenized.append(tokens)
    a, b = tokenized[0].tokens, tokenized[1].tokens
    common = common_prefix(a, b)
    divergent = first_divergent_token(a, b)
    divergence = None
    if divergent is not None:
        divergence = await _divergence(
            tokenizer, chosen, (a, b), divergent, first_messages, second_messages
        )
    cause = classify(
        first_messages,
        second_messages,
        common=common,
        identical_tokens=divergent is None,
        block_size=block_size,
        first_extras=_extras(first),
        second_extras=_extras(second),
    )
    predicted = predicted_cached_tokens(common, len(b), block_size)
    if hybrid:
        dense, predicted = predicted, hybrid_cached_tokens(len(a), common, len(b), block_size)
        if predicted < dense:
            cause = hybrid_cause(
                cause,
                first_tokens=len(a),
                common=common,
                second_tokens=len(b),
                block_size=block_size,
            )
    return MissDiagnosis(
        reachable=True,
        model=chosen,
        block_size=block_size,
        block_size_source=source,
        tokenizer="local" if local else "vllm",
        first_tokens=len(a),
        second_tokens=len(b),
        common_prefix_tokens=common,
        first_divergent_token=divergent,
        predicted_cached_tokens=predicted,
        divergence=divergence,
        cause=cause,
    )


async def _served_cache(
    client: VllmClient, model: str, *, need_block_size: bool
) -> tuple[int | None, bool] | Unavailable:
    """The served block size and whether the model is a hybrid, from vllm:cache_config_info.
    Without `need_block_size` (the caller gave it) a server that cannot say reads as dense."""
    snapshot = await client.metrics.snapshot(model)
    if isinstance(snapshot, Unavailable):
        return snapshot if need_block_size else (None, False)
    config = snapshot.cache_config
    if need_block_size and (config is None or not config.block_size):
        raise ConfigError(
            "vLLM does not report vllm:cache_config_info with a block_size: pass block_size "
            "(vLLM's --block-size)"
        )
    if config is None:
        return None, False
    return config.block_size, keeps_state_at_prefill_end_only(config.labels)


async def _divergence(
    tokenizer: ChatTokenizer,
    model: str,
    prompts: tuple[Sequence[int], Sequence[int]],
    at: int,
    first_messages: Sequence[dict[str, Any]],
    second_messages: Sequence[dict[str, Any]],
) -> Divergence:
    index = first_different_message(first_messages, second_messages)
    start = max(0, at - EXCERPT_BEFORE)
    excerpts = []
    for tokens in prompts:
        text = await tokenizer.detokenize(tokens[start : at + EXCERPT_AFTER], model=model)
        excerpts.append("" if isinstance(text, Unavailable) else text)
    return Divergence(
        message_index=index,
        role=None if index is None else role_at(first_messages, second_messages, index),
        first_excerpt=excerpts[0],
        second_excerpt=excerpts[1],
    )


async def _verify(
    client: VllmClient,
    model: str,
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    predicted: int,
) -> MissVerification | Unavailable:
    cached: list[int | None] = []
    source = "unavailable"
    for messages in (first, second):
        result = await client.chat(sendable(messages), model=model, max_tokens=VERIFY_MAX_TOKENS)
        if isinstance(result, Unavailable):
            return result
        cached.append(result.trace.prefix_cache_hit_tokens)
        source = result.trace.cached_tokens_source
    actual = cached[1]
    note = None
    if actual is not None and actual != predicted:
        note = (
            f"vLLM served {actual} cached tokens, the prediction was {predicted}: another "
            "request may have run in between, or blocks were evicted"
        )
    return MissVerification(
        first_cached_tokens=cached[0],
        cached_tokens=actual,
        cached_tokens_source=source,
        matches_prediction=None if actual is None else actual == predicted,
        note=note,
    )


def _extras(request: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: request[k] for k in ("tools", "chat_template", "chat_template_kwargs") if k in request
    }


def sendable(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    """The messages as the chat client sends them (plain text turns).

    Raises:
        ConfigError: a message the chat client cannot send (another role, non-text content).
    """
    try:
        return [ChatMessage.model_validate(message) for message in messages]
    except ValidationError as exc:
        raise ConfigError(
            "verify sends the requests as plain system/user/assistant text messages; "
            f"{describe_validation(exc, whole='messages')}: drop verify or simplify the messages"
        ) from None
