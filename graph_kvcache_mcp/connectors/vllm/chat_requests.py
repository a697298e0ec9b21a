"""The openai SDK side of one chat or completion call: typed parameters, the answer, failures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

import httpx2
import openai
from openai.types import Completion, CompletionUsage
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)

from graph_kvcache_mcp.connectors.vllm.errors import (
    MAX_MESSAGE_CHARS,
    bad_answer,
    from_status,
    from_transport,
    message_of,
    timed_out,
    unreachable,
)
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.outcomes import Unavailable


@dataclass(frozen=True)
class ChatRequest:
    messages: list[ChatCompletionMessageParam]
    max_tokens: int
    temperature: float


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    max_tokens: int
    temperature: float


Request: TypeAlias = ChatRequest | CompletionRequest
StreamChunk: TypeAlias = ChatCompletionChunk | Completion


@dataclass(frozen=True)
class Answer:
    """What came back from one call, before its cache accounting."""

    text: str
    usage: CompletionUsage | None
    finish_reason: str | None
    ttft_s: float | None = None


def chat_request(
    messages: list[ChatMessage], *, max_tokens: int, temperature: float
) -> ChatRequest:
    return ChatRequest([message_param(m) for m in messages], max_tokens, temperature)


def message_param(message: ChatMessage) -> ChatCompletionMessageParam:
    role: Literal["system", "user", "assistant"] = message.role
    match role:
        case "system":
            return ChatCompletionSystemMessageParam(role="system", content=message.content)
        case "user":
            return ChatCompletionUserMessageParam(role="user", content=message.content)
        case "assistant":
            return ChatCompletionAssistantMessageParam(role="assistant", content=message.content)


def pieces(chunk: StreamChunk) -> list[tuple[str | None, str | None]]:
    """(text, finish_reason) of each choice in a streamed chunk."""
    if isinstance(chunk, ChatCompletionChunk):
        return [(choice.delta.content, choice.finish_reason) for choice in chunk.choices]
    return [(choice.text, choice.finish_reason) for choice in chunk.choices]


def failure_of(
    exc: openai.APIError, root_url: str, timeout_s: float, *, streamed: bool = False
) -> Unavailable:
    """An openai client failure as a value.

    Raises:
        VllmRequestError: vLLM refused the request itself (4xx other than 401/403).
    """
    # httpx's own read timeout (also timeout_s) may fire before ours: the same reason either way.
    if isinstance(exc, openai.APITimeoutError):
        return timed_out(root_url, timeout_s, streamed=streamed)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        if isinstance(cause, httpx2.HTTPError):
            return from_transport(cause, root_url, timeout_s, streamed=streamed)
        return unreachable(root_url, exc)
    if isinstance(exc, openai.APIResponseValidationError):
        return bad_answer(root_url, "not the shape of an OpenAI answer", status=exc.status_code)
    if isinstance(exc, openai.APIStatusError):
        return from_status(exc.status_code, api_message(exc), root_url)
    return bad_answer(root_url, f"{type(exc).__name__}: {exc.message[:MAX_MESSAGE_CHARS]}")


def api_message(exc: openai.APIStatusError) -> str:
    """vLLM's own error message from an openai status error (either of vLLM's body shapes)."""
    return message_of(exc.body) or exc.message[:MAX_MESSAGE_CHARS]
