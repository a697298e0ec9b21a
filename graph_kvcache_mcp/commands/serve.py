"""`graph-kvcache-mcp serve`: the MCP server over stdio (default) or streamable HTTP on loopback.

Running `graph-kvcache-mcp` with no subcommand (flags allowed) is `serve` over stdio: that is what
hosts such as Claude Code and opencode launch. The verb reads its flags and the HTTP token; the
transports themselves (signals, the HTTP app and its gates) live in `host/stdio.py` and
`host/http_app.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
from pydantic import SecretStr

from graph_kvcache_mcp.commands._common import EXIT_BAD_INPUT, EXIT_OK, note
from graph_kvcache_mcp.config import Settings, split_list
from graph_kvcache_mcp.connectors.files.http_token import TOKEN_ENV, http_token
from graph_kvcache_mcp.connectors.files.working_dir import implicit_root
from graph_kvcache_mcp.connectors.net.peer_user import socket_owner
from graph_kvcache_mcp.host.http_app import HTTP_HOST, http_url
from graph_kvcache_mcp.services.stack.ports import port_in_use

DEFAULT_HTTP_PORT = 8765
_TOP_LEVEL_FLAGS = frozenset({"-h", "--help", "--version"})


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the MCP server (the default when no command is given)",
        description="Run the MCP server. Hosts launch `graph-kvcache-mcp` (stdio) directly.",
    )
    add_server_options(serve)
    serve.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (what hosts launch; the default) or streamable HTTP on 127.0.0.1",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"HTTP port on 127.0.0.1 (with --transport http only; default {DEFAULT_HTTP_PORT})",
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
    from graph_kvcache_mcp.host.http_app import serve_http
    from graph_kvcache_mcp.host.stdio import serve_stdio
    from graph_kvcache_mcp.server import build_server

    if args.transport == "stdio" and args.port is not None:
        note(
            f"error: --port {args.port} applies to --transport http only; add --transport http "
            "to serve HTTP, or drop --port to serve MCP over stdio"
        )
        return EXIT_BAD_INPUT
    port: int = DEFAULT_HTTP_PORT if args.port is None else args.port
    server = build_server(settings)
    if settings.file_roots is None and (broad := implicit_root()[1]) is not None:
        note(f"warning: {broad} (file tools refuse until then, unless the host declares roots)")
    if args.transport == "stdio":
        if sys.stdin.isatty():
            note(
                "graph-kvcache-mcp speaks MCP (JSON-RPC) on stdin/stdout: an MCP host launches "
                "it. Try `graph-kvcache-mcp --help`, or `demo`; Ctrl-D or Ctrl-C ends it"
            )
        anyio.run(serve_stdio, server)
        return EXIT_OK
    if not 1 <= port <= 65535:
        note(f"error: --port {port} is not a TCP port (1-65535)")
        return EXIT_BAD_INPUT
    if port_in_use(HTTP_HOST, port):
        note(f"error: port {port} on {HTTP_HOST} is already in use; choose another --port")
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
    gate = " (bearer token required)" if token is not None else ""
    note(f"serving MCP over streamable HTTP at {http_url(port)}{gate}")
    anyio.run(serve_http, server, port, token, socket_owner)
    return EXIT_OK
