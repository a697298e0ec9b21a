"""The MCP server over streamable HTTP on loopback: the SDK's app behind our ASGI gates.

`ReadableRpcErrors` answers a body that is not one JSON-RPC message with the spec's error;
`BearerTokenGate` (or, with --no-auth, `NoOAuthDiscovery`) guards every path; uvicorn serves it
with `http_guard`'s header deadline and per-user connection cap.
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from graph_kvcache_mcp.host.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    Refusal,
    RequestId,
    readable_id,
    refuse_text,
    refuse_value,
)

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from graph_kvcache_mcp.host.http_guard import SocketOwner

HTTP_HOST = "127.0.0.1"
HTTP_PATH = "/mcp"
KEPT_REQUEST_BYTES = 1024 * 1024
"""How much of a request body the HTTP error rewriter keeps to read a refused message's id."""
MAX_HTTP_BODY_BYTES = 96 * 1024 * 1024
"""Room for a 64 MiB value as base64 (~85.4 MiB) inside a JSON-RPC request; the SDK's 4 MiB
default refused values over ~3 MiB that the tools accept."""


def http_url(port: int) -> str:
    return f"http://{HTTP_HOST}:{port}{HTTP_PATH}"


async def serve_http(
    server: MCPServer[Any], port: int, token: SecretStr | None, socket_owner: SocketOwner
) -> None:
    import uvicorn

    app: ASGIApp = server.streamable_http_app(
        host=HTTP_HOST, max_request_body_size=MAX_HTTP_BODY_BYTES
    )
    app = ReadableRpcErrors(app)
    app = BearerTokenGate(app, token) if token is not None else NoOAuthDiscovery(app)
    from graph_kvcache_mcp.host.http_guard import guarded_protocol

    # A header deadline and a per-user connection cap (see http_guard): no slow-loris.
    config = uvicorn.Config(
        app, host=HTTP_HOST, port=port, log_level="warning", http=guarded_protocol(socket_owner)
    )
    await uvicorn.Server(config).serve()


class ReadableRpcErrors:
    """ASGI middleware: a 400 the SDK answers for a body that is not one JSON-RPC message gets
    the JSON-RPC error the spec names (`host/jsonrpc.py`: -32700 or -32600, with the id where
    one can be read) instead of -32602 and pydantic's report, and no `mcp-session-id` (a session
    minted for a refused message would only answer 404 next)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        kept = [0]  # bytes of the request kept to read its id from; past the cap, none
        held: list[Message] = []

        async def receive_body() -> Message:
            message = await receive()
            if message["type"] == "http.request" and kept[0] <= KEPT_REQUEST_BYTES:
                chunk = message.get("body", b"")
                kept[0] += len(chunk)
                chunks.append(chunk)
                if kept[0] > KEPT_REQUEST_BYTES:
                    chunks.clear()  # a large body is a value, not a malformed message
            return message

        async def send_answer(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 400:
                held.append(message)
                return
            if not held:
                await send(message)
                return
            held.append(message)
            if not message.get("more_body", False):
                start, *bodies = held
                body = b"".join(part.get("body", b"") for part in bodies)
                request = b"".join(chunks) if kept[0] <= KEPT_REQUEST_BYTES else None
                await _send_400(send, start, readable_rpc_error(body, request))

        await self.app(scope, receive_body, send_answer)


def readable_rpc_error(answer: bytes, request: bytes | None) -> bytes:
    """`answer` (the SDK's 400 body), or the spec's error for `request` when the SDK refused a
    body that is not one JSON-RPC message or came without a session (`request` None: a body too
    large to keep, answered without its id)."""
    try:
        error = json.loads(answer)["error"]
        code, message = error["code"], str(error["message"])
    except (ValueError, KeyError, TypeError):
        return answer
    text = "" if request is None else request.decode("utf-8", errors="replace")
    if code == PARSE_ERROR:
        refusal = refuse_text(text)[0]
    elif code == INVALID_PARAMS and message.startswith("Validation error"):
        try:
            refusal = refuse_value(json.loads(text))[0]
        except ValueError:
            refusal = Refusal(None, INVALID_REQUEST, "Invalid request: not one JSON-RPC message")
    elif message == "Bad Request: Missing session ID":
        why = (
            "no mcp-session-id header: send initialize first, then send the mcp-session-id "
            "header its answer carries with every later request"
        )
        refusal = Refusal(_request_id(text), code, why)
    else:
        return answer
    fixed = {"code": refusal.code, "message": refusal.message}
    return json.dumps({"jsonrpc": "2.0", "id": refusal.id, "error": fixed}).encode()


def _request_id(text: str) -> RequestId | None:
    try:
        return readable_id(json.loads(text))
    except ValueError:
        return None


async def _send_400(send: Send, start: Message, body: bytes) -> None:
    drop = {b"mcp-session-id", b"content-length"}
    headers = [
        (name, value) for name, value in start.get("headers", []) if name.lower() not in drop
    ]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class NoOAuthDiscovery:
    """ASGI middleware: OAuth discovery paths answer 404, so an OAuth-aware client sends its
    configured header instead of starting an authorization flow this server cannot finish."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _is_oauth_discovery(scope.get("path", "")):
            await _answer(send, 404, b'{"error": "this server does not use OAuth"}', [])
            return
        await self.app(scope, receive, send)


class BearerTokenGate:
    """ASGI middleware: HTTP requests need `Authorization: Bearer <token>` (the scheme in any
    case), compared in constant time; else 401 with a hint. OAuth discovery paths answer 404."""

    def __init__(self, app: ASGIApp, token: SecretStr) -> None:
        self.app = NoOAuthDiscovery(app)
        self._expected = token.get_secret_value().encode()

    def __repr__(self) -> str:
        return "BearerTokenGate(token=**********)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and not _is_oauth_discovery(scope.get("path", ""))
            and not self._authorized(scope)
        ):
            headers = [(b"www-authenticate", b'Bearer realm="graph-kvcache-mcp"')]
            await _answer(send, 401, UNAUTHORIZED_BODY, headers)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, credentials = bytes(value).strip().partition(b" ")
                given = credentials.strip()
                # compare_digest always runs, so timing does not tell a bad scheme from a bad token.
                matches = hmac.compare_digest(given, self._expected)
                return matches and scheme.lower() == b"bearer"
        return False


UNAUTHORIZED_BODY = json.dumps(
    {
        "error": "missing or wrong bearer token",
        "hint": "send 'Authorization: Bearer <token>' with the token from "
        "GRAPH_KVCACHE_HTTP_TOKEN, or from <data dir>/http-token (named on the server's stderr)",
    }
).encode()


def _is_oauth_discovery(path: str) -> bool:
    return path.startswith(("/.well-known/oauth-", "/.well-known/openid-configuration"))


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
