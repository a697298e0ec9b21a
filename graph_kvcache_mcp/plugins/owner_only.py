"""ASGI pieces our LMCache entry points put in front of LMCache's HTTP apps (which have no
authentication and listen on loopback TCP, where every local user can connect): a request is
served only when the connection's client socket belongs to our own user (`peer_user`)."""

from __future__ import annotations

import json
import os
from typing import Any

from graph_kvcache_mcp.connectors.net.peer_user import socket_owner


def from_owner(scope: Any) -> bool:
    """Whether the connection of an ASGI `scope` was made by a process of our user."""
    client, server = scope.get("client"), scope.get("server")
    if not client or not server:
        return False
    return socket_owner(tuple(client), tuple(server)) == os.geteuid()


async def refuse(send: Any, status: int, detail: str) -> None:
    """Answer a refused HTTP request with `status` and a JSON `detail`."""
    await answer_json(send, status, {"detail": detail})


async def answer_json(send: Any, status: int, payload: dict[str, str]) -> None:
    """Answer an HTTP request with `status` and `payload` as JSON."""
    body = json.dumps(payload).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class OwnerOnly:
    """ASGI middleware: 403 to every HTTP request another user's process made (a websocket
    from one is closed unanswered)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" or from_owner(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await refuse(send, 403, "Forbidden: this LMCache service serves its owner only")
