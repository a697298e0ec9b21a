"""The shapes one chat or completion call sends and gets back, typed against the openai SDK."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from openai.types import Completion, CompletionUsage
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)

from graph_kvcache_mcp.domain.bundle import ChatMessage


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
