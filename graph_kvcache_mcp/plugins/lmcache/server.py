"""`lmcache server` as the managed stack runs it:
`python -m graph_kvcache_mcp.plugins.lmcache.server server <the flags of lmcache server>`.

LMCache's admin HTTP API has no authentication and listens on a loopback TCP port that every local
user can reach (0.5.6 binds it with uvicorn's host and port only: no unix socket). Among its
routes, `GET /env` returns the server's whole environment, and others clear the cache, reset the
metrics, change quotas, add or remove L2 adapters, or run a script. Before the server starts, this
entry point answers 404 to all but the read-only routes the project reads (`ADMIN_ROUTES`), so a
neighbour reaching the port learns health, status, version and counters, and changes nothing.

LMCache's KV RPC (ZMQ, no authentication either) is bound by the 0.5.6 server on
`tcp://<host>:<port>` only, though its clients accept `ipc://`. With `GRAPH_KVCACHE_LMCACHE_RPC_URL`
set (an `ipc://` socket in the data dir's private directory), the server's request queue binds
there instead, so only its owner can connect; vLLM's connector is pointed at it with
`lmcache.mp.server_urls`.

The RESP password reaches LMCache's own `resp` adapter (which reads `LMCACHE_RESP_PASSWORD`) from
the private file `LMCACHE_RESP_PASSWORD_FILE` names, set in this process only: the environment
the server was started with never holds it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ADMIN_ROUTES = frozenset({"/", "/healthcheck", "/status", "/lmc_version", "/metrics"})
"""GET routes kept: what `connectors/lmcache/admin_http.py` and the lifecycle read."""
RESP_PASSWORD_ENV = "LMCACHE_RESP_PASSWORD"
RPC_URL_ENV = "GRAPH_KVCACHE_LMCACHE_RPC_URL"
FILE_SUFFIX = "_FILE"


class AdminRoutesOnly:
    """ASGI middleware answering 404 to everything but GET/HEAD on `allowed` paths (routes are
    refused before LMCache's router sees them, whatever shape that router has)."""

    def __init__(self, app: Any, allowed: frozenset[str] = ADMIN_ROUTES) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" or (
            scope["type"] == "http"
            and scope["method"] in ("GET", "HEAD")
            and scope["path"] in self.allowed
        ):
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # a websocket: closed unanswered
        body = b'{"detail":"Not Found"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def load_filed_secret(name: str) -> None:
    """Set `name` in this process from the private file `<name>_FILE` names (then forget the
    path), for LMCache code that reads `name` from the environment."""
    path = os.environ.pop(name + FILE_SUFFIX, None)
    if path:
        os.environ[name] = Path(path).read_text(encoding="utf-8").strip()


def bind_rpc_privately(url: str) -> None:
    """Make LMCache's ZMQ request server bind `url` instead of the TCP address it builds."""
    from lmcache.v1.multiprocess.transport.zmq_impl import server as zmq_server

    queue = zmq_server.MessageQueueServer

    def private_queue(*, bind_url: str, context: Any) -> Any:
        del bind_url  # tcp://<host>:<port>: every local user could connect
        return queue(bind_url=url, context=context)

    zmq_server.MessageQueueServer = private_queue


def main(argv: Sequence[str] | None = None) -> None:
    # LMCache's heavy imports happen here, inside the server process, never at module import.
    from lmcache.cli.main import main as lmcache_main
    from lmcache.v1.multiprocess.http_server import app

    app.add_middleware(AdminRoutesOnly)
    load_filed_secret(RESP_PASSWORD_ENV)
    if url := os.environ.get(RPC_URL_ENV):
        bind_rpc_privately(url)
    lmcache_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
