"""Over stdio, every line that is not one JSON-RPC message is answered, not dropped.

A line that is not JSON, holds a lone surrogate escape, is a batch, has params that are not an
object or an id without a method reaches the SDK's stdio transport as an exception, which it
drops: the client then waits for its timeout. `answering_malformed` takes those out of the read
stream and answers each at once with the JSON-RPC error `host/jsonrpc.py` names (and a log line).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.shared.message import SessionMessage
from mcp.types import ErrorData, JSONRPCError
from pydantic import ValidationError

from graph_kvcache_mcp.errors import quoted
from graph_kvcache_mcp.host.jsonrpc import Refusal, refuse_text, refuse_value

logger = logging.getLogger(__name__)


class _Sender(Protocol):
    async def send(self, item: SessionMessage, /) -> None: ...


@asynccontextmanager
async def answering_malformed(
    read_stream: AsyncIterable[SessionMessage | Exception], write_stream: _Sender
) -> AsyncIterator[MemoryObjectReceiveStream[SessionMessage | Exception]]:
    """`read_stream` with every message the transport could not read taken out and answered on
    `write_stream` (JSON-RPC -32700 or -32600, with the id when one can be read) and logged."""
    send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

    async def forward() -> None:
        async with send:
            async for item in read_stream:
                if not isinstance(item, Exception):
                    await send.send(item)
                    continue
                for refusal in refusals_for(item):
                    logger.warning(
                        "refused a malformed message (%d, id %s): %s",
                        refusal.code,
                        quoted(refusal.id),
                        refusal.message,
                    )
                    error = ErrorData(code=refusal.code, message=refusal.message)
                    answer = JSONRPCError(jsonrpc="2.0", id=refusal.id, error=error)
                    await write_stream.send(SessionMessage(answer))

    async with anyio.create_task_group() as group, receive:
        group.start_soon(forward)
        yield receive
        group.cancel_scope.cancel()


def refusals_for(exc: Exception) -> list[Refusal]:
    """The answers to the message behind `exc`, the SDK's failure to read one line."""
    if not isinstance(exc, ValidationError):
        return refuse_text("")
    for error in exc.errors(include_url=False):
        if error["type"] == "json_invalid":
            return refuse_text(str(error["input"]))
    return refuse_value(_whole_message(exc))


def _whole_message(exc: ValidationError) -> object:
    # pydantic reports each union member's problems; one of them holds the whole message as its
    # input: a type error at the top (an array, a string) or a missing field of the top object.
    for error in exc.errors(include_url=False):
        depth = len(error["loc"])
        if depth <= 1 or (error["type"] == "missing" and depth == 2):
            return error["input"]
    return None
