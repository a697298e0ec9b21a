"""The openai SDK side of one chat or completion call: typed parameters, the answer gathered whole
or streamed chunk by chunk with every wait bounded, and failures. `VllmClient` times the call and
credits its cache."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal, TypeAlias

import anyio
import httpx2
import openai
from openai.types import Completion, CompletionUsage
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionStreamOptionsParam,
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
    exc: openai.APIError,
    root_url: str,
    timeout_s: float,
    *,
    streamed: bool = False,
    trusted: str | None = None,
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
            return from_transport(cause, root_url, timeout_s, streamed=streamed, trusted=trusted)
        return unreachable(root_url, exc, trusted=trusted)
    if isinstance(exc, openai.APIResponseValidationError):
        return bad_answer(root_url, "not the shape of an OpenAI answer", status=exc.status_code)
    if isinstance(exc, openai.APIStatusError):
        return from_status(exc.status_code, api_message(exc), root_url)
    return bad_answer(root_url, f"{type(exc).__name__}: {exc.message[:MAX_MESSAGE_CHARS]}")


def api_message(exc: openai.APIStatusError) -> str:
    """vLLM's own error message from an openai status error (either of vLLM's body shapes)."""
    return message_of(exc.body) or exc.message[:MAX_MESSAGE_CHARS]


_STREAM_OPTIONS: ChatCompletionStreamOptionsParam = {"include_usage": True}


async def whole_answer(client: openai.AsyncOpenAI, request: Request, model: str) -> Answer:
    """The whole answer of one call, in one reply (the caller bounds the wait)."""
    if isinstance(request, ChatRequest):
        reply = await client.chat.completions.create(
            model=model,
            messages=request.messages,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            stream=False,
        )
        choice = reply.choices[0] if reply.choices else None
        return Answer(
            text=(choice.message.content or "") if choice else "",
            usage=reply.usage,
            finish_reason=choice.finish_reason if choice else None,
        )
    completion = await client.completions.create(
        model=model,
        prompt=request.prompt,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        stream=False,
    )
    first = completion.choices[0] if completion.choices else None
    return Answer(
        text=first.text if first else "",
        usage=completion.usage,
        finish_reason=first.finish_reason if first else None,
    )


async def streamed_answer(
    client: openai.AsyncOpenAI, request: Request, model: str, *, start: float, timeout_s: float
) -> Answer | None:
    """The answer of one call, streamed; None when vLLM sent no chunk at all. Each wait (for the
    headers, then for every chunk) is bounded by `timeout_s`; the stream is closed however this
    ends, so a cancelled call gives its connection back. `start`: the call's perf_counter start,
    for the time to the first token."""
    parts: list[str] = []
    usage: CompletionUsage | None = None
    finish: str | None = None
    ttft: float | None = None
    chunks = 0
    async with aclosing(_chunks(client, request, model, timeout_s)) as stream:
        async for chunk in stream:
            chunks += 1
            if chunk.usage is not None:
                usage = chunk.usage
            for text, finished in pieces(chunk):
                # vLLM's first chunk with a choice carries the first token (after prefill).
                if ttft is None:
                    ttft = time.perf_counter() - start
                if text:
                    parts.append(text)
                if finished:
                    finish = finished
    if chunks == 0:
        return None
    return Answer(text="".join(parts), usage=usage, finish_reason=finish, ttft_s=ttft)


async def _chunks(
    client: openai.AsyncOpenAI, request: Request, model: str, timeout_s: float
) -> AsyncGenerator[StreamChunk, None]:
    with anyio.fail_after(timeout_s):
        if isinstance(request, ChatRequest):
            stream: (
                openai.AsyncStream[ChatCompletionChunk] | openai.AsyncStream[Completion]
            ) = await client.chat.completions.create(
                model=model,
                messages=request.messages,
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                stream=True,
                stream_options=_STREAM_OPTIONS,
            )
        else:
            stream = await client.completions.create(
                model=model,
                prompt=request.prompt,
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                stream=True,
                stream_options=_STREAM_OPTIONS,
            )
    try:
        iterator: AsyncIterator[StreamChunk] = aiter(stream)
        while True:
            with anyio.fail_after(timeout_s):
                chunk = await anext(iterator, None)
            if chunk is None:
                return
            yield chunk
    finally:
        # Shielded: a cancelled call must still hand its connection back to the pool.
        with anyio.CancelScope(shield=True):
            await stream.close()
