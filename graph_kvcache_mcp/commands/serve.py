"""`graph-kvcache-mcp serve`: the MCP server over stdio (default) or streamable HTTP on loopback.

Running `graph-kvcache-mcp` with no subcommand (flags allowed) is `serve` over stdio: that is what
hosts such as Claude Code and opencode launch. On stdio, SIGTERM/SIGHUP/SIGINT end the server
through its lifespan, so a managed engine it started is stopped (or kept with --keep-engine).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import SecretStr

from graph_kvcache_mcp.commands._common import EXIT_BAD_INPUT, EXIT_OK, note
from graph_kvcache_mcp.config import Settings, split_list
from graph_kvcache_mcp.connectors.files.http_token import TOKEN_ENV, http_token
from graph_kvcache_mcp.connectors.processes.ports import port_in_use

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Receive, Scope, Send

    from graph_kvcache_mcp.state import AppState
    from graph_kvcache_mcp.strict_server import StrictServer

HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8765
HTTP_PATH = "/mcp"
MAX_HTTP_BODY_BYTES = 96 * 1024 * 1024
"""Room for a 64 MiB value as base64 (~85.4 MiB) inside a JSON-RPC request; the SDK's 4 MiB
default refused values over ~3 MiB that the tools accept."""
SIGNAL_CLEANUP_S = 30.0
"""How long a signalled stdio server waits for its cleanup (stopping its engine) before exiting."""
_TOP_LEVEL_FLAGS = frozenset({"-h", "--help", "--version"})


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the MCP server (the default when no command is given)",
        description="Run the MCP server. Hosts launch `graph-kvcache-mcp` (stdio) directly.",
    )
    add_server_options(serve)
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_HTTP_PORT, help="HTTP port on 127.0.0.1 (http only)"
    )
    auth = serve.add_mutually_exclusive_group()
    auth.add_argument(
        "--http-token",
        action="store_true",
        help="require a bearer token on HTTP (the default; kept for older scripts): "
        "GRAPH_KVCACHE_HTTP_TOKEN, else one generated into <data dir>/http-token (0600)",
    )
    auth.add_argument(
        "--no-auth",
        action="store_true",
        help="serve HTTP without a token: every local process can then call every tool",
    )
    serve.set_defaults(handler=run_serve, defer_endpoint_errors=True)


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """Flags that shape the server itself (shared with `demo`)."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the managed engine keeps state (default: $GRAPH_KVCACHE_DATA_DIR or "
        "~/.local/share/graph-kvcache-mcp)",
    )
    parser.add_argument(
        "--url", dest="kv_url", default=None, help="engine base URL (never starts an engine)"
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        default=None,
        help="register no tool that writes, starts or stops anything (GRAPH_KVCACHE_READ_ONLY)",
    )
    parser.add_argument(
        "--toolsets",
        type=split_list,
        default=None,
        help="comma-separated tool groups to register, e.g. kv,engine (GRAPH_KVCACHE_TOOLSETS)",
    )
    parser.add_argument(
        "--start-engine",
        action="store_true",
        default=None,
        help="start the managed engine at startup instead of on first KV use",
    )
    parser.add_argument(
        "--keep-engine",
        action="store_true",
        default=None,
        help="leave the managed engine (and lmcache server) running when this server exits",
    )


def default_to_serve(argv: Sequence[str]) -> list[str]:
    """`graph-kvcache-mcp [server flags]` without a command means `serve` (stdio)."""
    items = list(argv)
    if not items or (items[0].startswith("-") and items[0] not in _TOP_LEVEL_FLAGS):
        return ["serve", *items]
    return items


def run_serve(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: the SDK and server stack cost ~0.5 s, which every other CLI command skips.
    from graph_kvcache_mcp.server import build_server

    server = build_server(settings)
    if args.transport == "stdio":
        anyio.run(serve_stdio, server)
        return EXIT_OK
    if not 1 <= args.port <= 65535:
        note(f"error: --port {args.port} is not a TCP port (1-65535)")
        return EXIT_BAD_INPUT
    if port_in_use(HTTP_HOST, args.port):
        note(f"error: port {args.port} on {HTTP_HOST} is already in use; choose another --port")
        return EXIT_BAD_INPUT
    token: SecretStr | None = None
    if args.no_auth:
        note(
            "warning: --no-auth: any process on this machine can call every tool of this server "
            "(read files in the allowed roots, store values, start processes)"
        )
    else:
        found = http_token(settings)
        token = found.value
        if found.source == TOKEN_ENV:
            note(f"HTTP bearer token: from {TOKEN_ENV}")
        else:
            made = "generated into" if found.created else "read from"
            note(f"HTTP bearer token {made} {found.source} (send 'Authorization: Bearer <token>')")
    anyio.run(serve_http, server, args.port, token)
    return EXIT_OK


async def serve_stdio(server: StrictServer[AppState]) -> None:
    """Serve until stdin closes or a signal arrives; either way the lifespan cleans up."""
    async with anyio.create_task_group() as group:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as sigs:
                async for _ in sigs:
                    break
            group.cancel_scope.cancel()
            # The SDK reads stdin in a worker thread that only a line or EOF can wake, so the
            # task group would wait for it forever. Wait for the lifespan's cleanup (engine
            # stopped), then leave without that thread.
            state = server.live_state()
            if state is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(SIGNAL_CLEANUP_S):
                    await state.closed.wait()
            sys.stderr.flush()
            os._exit(0)

        group.start_soon(stop_on_signal)
        await server.run_stdio_async()
        group.cancel_scope.cancel()


async def serve_http(server: MCPServer[Any], port: int, token: SecretStr | None) -> None:
    import uvicorn

    app: ASGIApp = server.streamable_http_app(
        host=HTTP_HOST, max_request_body_size=MAX_HTTP_BODY_BYTES
    )
    app = BearerTokenGate(app, token) if token is not None else NoOAuthDiscovery(app)
    url = f"http://{HTTP_HOST}:{port}{HTTP_PATH}"
    gate = " (bearer token required)" if token is not None else ""
    note(f"serving MCP over streamable HTTP at {url}{gate}")
    config = uvicorn.Config(app, host=HTTP_HOST, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


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
