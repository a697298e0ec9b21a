"""`graph-kvcache-mcp serve`: the MCP server over stdio (default) or streamable HTTP on loopback.

Running `graph-kvcache-mcp` with no subcommand (flags allowed) is `serve` over stdio: that is what
hosts such as Claude Code and opencode launch. On stdio, SIGTERM/SIGHUP/SIGINT end the server
through its lifespan, so a managed engine it started is stopped (or kept with --keep-engine).
"""

from __future__ import annotations

import argparse
import hmac
import os
import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import SecretStr

from graph_kvcache_mcp.commands._common import EXIT_BAD_INPUT, EXIT_OK, note
from graph_kvcache_mcp.config import Settings, split_list
from graph_kvcache_mcp.connectors.ports import port_in_use
from graph_kvcache_mcp.connectors.private_files import write_private
from graph_kvcache_mcp.state import live_state

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Receive, Scope, Send

HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8765
HTTP_PATH = "/mcp"
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
    serve.add_argument(
        "--http-token",
        action="store_true",
        help="require a bearer token on HTTP: GRAPH_KVCACHE_HTTP_TOKEN, else a generated one "
        "written to <data dir>/http-token (0600)",
    )
    serve.set_defaults(handler=run_serve)


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
        help="leave a managed engine this server started running when it exits",
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
    token = http_token(settings) if args.http_token else None
    anyio.run(serve_http, server, args.port, token)
    return EXIT_OK


async def serve_stdio(server: MCPServer[Any]) -> None:
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
            state = live_state(server)
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

    app: ASGIApp = server.streamable_http_app(host=HTTP_HOST)
    if token is not None:
        app = BearerTokenGate(app, token)
    url = f"http://{HTTP_HOST}:{port}{HTTP_PATH}"
    gate = " (bearer token required)" if token is not None else ""
    note(f"serving MCP over streamable HTTP at {url}{gate}")
    config = uvicorn.Config(app, host=HTTP_HOST, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def http_token(settings: Settings) -> SecretStr:
    """The token HTTP clients must send: from the environment, else generated and saved 0600."""
    if settings.http_token is not None:
        note("HTTP bearer token: GRAPH_KVCACHE_HTTP_TOKEN")
        return settings.http_token
    path = settings.data_dir / "http-token"
    write_private(path, secrets.token_hex(32))
    note(f"HTTP bearer token written to {path} (send it as 'Authorization: Bearer <token>')")
    return SecretStr(path.read_text().strip())


class BearerTokenGate:
    """ASGI middleware: HTTP requests need `Authorization: Bearer <token>`; else 401."""

    def __init__(self, app: ASGIApp, token: SecretStr) -> None:
        self.app = app
        self._expected = f"Bearer {token.get_secret_value()}".encode()

    def __repr__(self) -> str:
        return "BearerTokenGate(token=**********)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._authorized(scope):
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"www-authenticate", b'Bearer realm="graph-kvcache-mcp"'),
                        (b"content-type", b"application/json"),
                    ],
                }
            )
            await send(
                {
                    "type": "http.response.body",
                    "body": b'{"error": "missing or wrong bearer token"}',
                }
            )
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                return hmac.compare_digest(bytes(value), self._expected)
        return False
