"""Doubles for the vLLM answers a real vLLM cannot be made to give, on loopback sockets.

Each one is named for what it does; the real server is `tests.support.vllm`.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.support.peers import garbage_peer, loopback_peer

PROXY_PAGE = "<html><head><title>Gateway</title></head><body>Please log in</body></html>"


def http_reply(status: str, body: str, content_type: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection."""
    data = body.encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


@contextmanager
def proxy_page_peer() -> Iterator[str]:
    """Answers every request 200 with an HTML page, as a proxy or a login wall does."""
    with garbage_peer(http_reply("200 OK", PROXY_PAGE, "text/html; charset=utf-8")) as url:
        yield url


@contextmanager
def failing_vllm_peer(message: str) -> Iterator[str]:
    """Answers every request 500 with vLLM's error body carrying `message`."""
    body = json.dumps({"error": {"message": message, "type": "InternalServerError", "code": 500}})
    with garbage_peer(http_reply("500 Internal Server Error", body, "application/json")) as url:
        yield url


CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}],
}


@dataclass
class StalledStream:
    """What a stalled-stream double saw."""

    url: str
    first_chunk_sent: threading.Event = field(default_factory=threading.Event)
    client_closed: threading.Event = field(default_factory=threading.Event)


def sse_chunk(event: object) -> bytes:
    """One server-sent event as one chunk of a chunked HTTP body."""
    data = f"data: {json.dumps(event)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@contextmanager
def stalled_stream_peer(*, then: object = None) -> Iterator[StalledStream]:
    """Starts a streamed chat answer (headers and one chunk, then the event `then` if given),
    then sends nothing more; records when the client closes the connection."""
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    body = sse_chunk(CHUNK) + (b"" if then is None else sse_chunk(then))
    seen: list[StalledStream] = []

    def handle(conn: socket.socket, stop: threading.Event) -> None:
        with conn:
            conn.settimeout(0.2)
            try:
                conn.recv(65536)
                conn.sendall(head.encode() + body)
            except OSError:
                return
            seen[0].first_chunk_sent.set()
            while not stop.is_set():
                try:
                    if conn.recv(1) == b"":
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            seen[0].client_closed.set()

    with loopback_peer(handle, thread_per_connection=True) as url:
        seen.append(StalledStream(url))
        yield seen[0]
