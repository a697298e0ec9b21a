"""`lmcache server` as the managed stack runs it:
`python -m graph_kvcache_mcp.plugins.lmcache.server server <the flags of lmcache server>`.

LMCache's admin HTTP API has no authentication and listens on a loopback TCP port that every local
user can reach (0.5.6 binds it with uvicorn's host and port only: no unix socket). Among its
routes, `GET /env` returns the server's whole environment, and others clear the cache, reset the
metrics, change quotas, add or remove L2 adapters, or run a script. Before the server starts, this
entry point answers 404 to all but the read-only routes the project reads (`ADMIN_ROUTES`), and
to every request whose client socket is not our user's (`owner_only.from_owner`), so a neighbour
reaching the port learns nothing and changes nothing.

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

from graph_kvcache_mcp.plugins.lmcache.owner_only import from_owner, refuse

ADMIN_ROUTES = frozenset({"/", "/healthcheck", "/status", "/lmc_version", "/metrics", "/config"})
"""GET routes kept: what `connectors/lmcache/admin_http.py` and the lifecycle read (`/config`
names the chunk size and hash; secrets reach the server by file, never through its config)."""
COORDINATOR_ROUTES = frozenset(
    {("POST", "/cache/prefetches"), ("DELETE", "/cache/objects"), ("GET", "/cache/objects")}
)
"""What LMCache's coordinator calls back on a server joined to it, to warm and evict L1 (and
the poll of a prefetch, `GET /cache/prefetches/<id>`): served only to a connection our own user
made (`owner_only.from_owner`), as the coordinator runs as that user."""
PREFETCH_POLL = "/cache/prefetches/"
COORDINATOR_URL_FLAG = "--coordinator-url"  # LMCache's flag; this module imports none of ours
RESP_PASSWORD_ENV = "LMCACHE_RESP_PASSWORD"
RPC_URL_ENV = "GRAPH_KVCACHE_LMCACHE_RPC_URL"
FILE_SUFFIX = "_FILE"


class AdminRoutesOnly:
    """ASGI middleware answering 404 to everything but GET/HEAD on `allowed` paths (routes are
    refused before LMCache's router sees them, whatever shape that router has)."""

    def __init__(
        self, app: Any, allowed: frozenset[str] = ADMIN_ROUTES, coordinator: bool = False
    ) -> None:
        self.app = app
        self.allowed = allowed
        self.coordinator = coordinator  # joined: the coordinator's callbacks are served too

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # Every route to our own user only: the coordinator's callbacks, and `/config` (the
        # chunk size, hash and L2 wiring) and the counters, which tell a neighbour how busy we are.
        if scope["type"] == "lifespan" or (
            scope["type"] == "http" and self._serves(scope) and from_owner(scope)
        ):
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # a websocket: closed unanswered
        await refuse(send, 404, "Not Found")

    def _serves(self, scope: Any) -> bool:
        method, path = scope["method"], scope["path"]
        if method in ("GET", "HEAD") and path in self.allowed:
            return True
        if not self.coordinator:
            return False
        callback = (method, path) in COORDINATOR_ROUTES or (
            method == "GET" and path.startswith(PREFETCH_POLL)
        )
        return callback


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

    args = list(sys.argv[1:] if argv is None else argv)
    joined = any(arg.split("=", 1)[0] == COORDINATOR_URL_FLAG for arg in args)
    app.add_middleware(AdminRoutesOnly, coordinator=joined)
    load_filed_secret(RESP_PASSWORD_ENV)
    if url := os.environ.get(RPC_URL_ENV):
        bind_rpc_privately(url)
    lmcache_main(args)


if __name__ == "__main__":
    main()
