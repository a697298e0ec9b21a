"""`lmcache server` as the managed stack runs it:
`python -m graph_kvcache_mcp.plugins.lmcache.server server <the flags of lmcache server>`.

LMCache's admin HTTP API has no authentication and listens on a loopback TCP port that every local
user can reach (0.5.6 binds it with uvicorn's host and port only: no unix socket). Among its
routes, `GET /env` returns the server's whole environment, and others clear the cache, reset the
metrics, change quotas, add or remove L2 adapters, or run a script. Before the server starts, this
entry point answers 404 to all but the read-only routes the project reads (`ADMIN_ROUTES`), so a
neighbour reaching the port learns health, status, version and counters, and changes nothing.

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


def main(argv: Sequence[str] | None = None) -> None:
    # LMCache's heavy imports happen here, inside the server process, never at module import.
    from lmcache.cli.main import main as lmcache_main
    from lmcache.v1.multiprocess.http_server import app

    app.add_middleware(AdminRoutesOnly)
    load_filed_secret(RESP_PASSWORD_ENV)
    lmcache_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
