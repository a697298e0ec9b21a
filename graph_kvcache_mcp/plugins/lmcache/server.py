"""`lmcache server` as the managed stack runs it:
`python -m graph_kvcache_mcp.plugins.lmcache.server server <the flags of lmcache server>`.

LMCache's admin HTTP API has no authentication and listens on a loopback TCP port that every local
user can reach (0.5.6 binds it with uvicorn's host and port only: no unix socket). Among its
routes, `GET /env` returns the server's whole environment, and others clear the cache, reset the
metrics, change quotas, add or remove L2 adapters, or run a script. Before the server starts, this
entry point answers 404 to all but the read-only routes the project reads (`ADMIN_ROUTES`), and
to every request whose client socket is not our user's (`owner_only.from_owner`), so a neighbour
reaching the port learns nothing and changes nothing. Of deletes it passes on only an unforced L1
one (`l1_delete_only`), whoever asked a coordinator to forward it.

The server's coordinator instance id is drawn here when its flags name none, and told to its
owner (`REPORTED_INSTANCE_ROUTE`): our tools then find our registration by that id, never by
"the newest registration at this address", which any local user can forge at a coordinator
without our filter.

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

import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.domain.fleet.tier_trust import REPORTED_INSTANCE_ROUTE
from graph_kvcache_mcp.domain.lmcache.process_spec import flag_value
from graph_kvcache_mcp.plugins.owner_only import answer_json, from_owner, refuse

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
DELETE_ROUTE = ("DELETE", "/cache/objects")
"""Served only for an explicit, unforced L1 delete (`l1_delete_only`). A coordinator the user
named by URL may be LMCache's own, unfiltered: any local user can ask it to delete, and it
forwards as our user. Its L2 delete (LMCache's default tier) reaches the engine through the
`resp` adapter in `redis_resp` mode, and `force` drops chunks a request is using."""
MAX_DELETE_BODY = 4 * 1024 * 1024
COORDINATOR_URL_FLAG = "--coordinator-url"  # LMCache's flags
INSTANCE_ID_FLAG = "--instance-id"
RESP_PASSWORD_ENV = "LMCACHE_RESP_PASSWORD"
RPC_URL_ENV = "GRAPH_KVCACHE_LMCACHE_RPC_URL"
FILE_SUFFIX = "_FILE"


class AdminRoutesOnly:
    """ASGI middleware answering 404 to everything but GET/HEAD on `allowed` paths (routes are
    refused before LMCache's router sees them, whatever shape that router has)."""

    def __init__(
        self,
        app: Any,
        allowed: frozenset[str] = ADMIN_ROUTES,
        coordinator: bool = False,
        instance_id: str | None = None,
    ) -> None:
        self.app = app
        self.allowed = allowed
        self.coordinator = coordinator  # joined: the coordinator's callbacks are served too
        self.instance_id = instance_id
        """The id the server registers under at its coordinator, told to its owner only."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # a websocket: closed unanswered
        # Every route to our own user only: the coordinator's callbacks, and `/config` (the
        # chunk size, hash and L2 wiring) and the counters, which tell a neighbour how busy we are.
        if not (self._serves(scope) and from_owner(scope)):
            await refuse(send, 404, "Not Found")
            return
        if self.instance_id is not None and scope["path"] == REPORTED_INSTANCE_ROUTE:
            await answer_json(send, 200, {"instance_id": self.instance_id})
            return
        if (scope["method"], scope["path"]) == DELETE_ROUTE:
            allowed, receive = await l1_delete_only(receive)
            if not allowed:
                await refuse(send, 403, "Forbidden: only an unforced tier=l1 delete is served")
                return
        await self.app(scope, receive, send)

    def _serves(self, scope: Any) -> bool:
        method, path = scope["method"], scope["path"]
        if method in ("GET", "HEAD") and (
            path in self.allowed or (path == REPORTED_INSTANCE_ROUTE and self.instance_id)
        ):
            return True
        if not self.coordinator:
            return False
        callback = (method, path) in COORDINATOR_ROUTES or (
            method == "GET" and path.startswith(PREFETCH_POLL)
        )
        return callback


async def l1_delete_only(receive: Any) -> tuple[bool, Any]:
    """Whether a `DELETE /cache/objects` body asks for an unforced L1 delete only (`"tier":
    "l1"` said outright, `force` absent or false), and a `receive` that hands the app the body
    read to tell."""
    messages: list[Any] = []
    body = b""
    while len(body) <= MAX_DELETE_BODY:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    else:
        return False, receive
    try:
        request = json.loads(body)
    except ValueError:
        return False, receive
    allowed = (
        isinstance(request, dict)
        and request.get("tier") == "l1"
        and request.get("force", False) is False
    )

    async def replay() -> Any:
        return messages.pop(0) if messages else await receive()

    return allowed, replay


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
    instance_id = flag_value(args, INSTANCE_ID_FLAG)
    if instance_id is None:  # LMCache would draw one and tell no one: draw it here, and report it
        instance_id = str(uuid.uuid4())
        args += [INSTANCE_ID_FLAG, instance_id]
    app.add_middleware(AdminRoutesOnly, coordinator=joined, instance_id=instance_id)
    load_filed_secret(RESP_PASSWORD_ENV)
    if url := os.environ.get(RPC_URL_ENV):
        bind_rpc_privately(url)
    lmcache_main(args)


if __name__ == "__main__":
    main()
