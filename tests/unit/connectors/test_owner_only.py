"""The owner-only filter in front of LMCache's HTTP apps, over real loopback connections: a
request our user's socket made is served, one no socket of ours made is refused, a joined
server's coordinator callbacks included. (`nobody`'s own requests: the coordinator and stack
neighbour tests.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from graph_kvcache_mcp.plugins.lmcache.owner_only import OwnerOnly, from_owner
from graph_kvcache_mcp.plugins.lmcache.server import AdminRoutesOnly


@pytest.fixture
def connection() -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """(client, server) addresses of a live loopback connection this process made."""
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()),
    ):
        accepted, peer = server.accept()
        with accepted:
            yield peer, server.getsockname()


def _scope(client: tuple[str, int], server: tuple[str, int], method: str, path: str) -> Any:
    return {"type": "http", "method": method, "path": path, "client": client, "server": server}


async def _status(app: Any, scope: Any) -> int:
    sent: list[Any] = []

    async def inner(_scope: Any, _receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request"}

    await app(inner)(scope, receive, send)
    return int(sent[0]["status"])


def test_our_own_connection_is_the_owners_and_an_unknown_one_is_not(
    connection: tuple[tuple[str, int], tuple[str, int]],
) -> None:
    client, server = connection
    assert from_owner({"client": client, "server": server})
    assert not from_owner({"client": ("127.0.0.1", 1), "server": server})
    assert not from_owner({"client": None, "server": server})


def test_the_filters_refuse_what_no_socket_of_ours_sent(
    connection: tuple[tuple[str, int], tuple[str, int]],
) -> None:
    client, server = connection
    stranger = ("127.0.0.1", 1)  # no socket of ours has this address

    async def statuses() -> list[int]:
        return [
            await _status(OwnerOnly, _scope(client, server, "GET", "/directory/keys")),
            await _status(OwnerOnly, _scope(stranger, server, "GET", "/directory/keys")),
            await _status(
                lambda app: AdminRoutesOnly(app, coordinator=True),
                _scope(client, server, "DELETE", "/cache/objects"),
            ),
            await _status(
                lambda app: AdminRoutesOnly(app, coordinator=True),
                _scope(stranger, server, "DELETE", "/cache/objects"),
            ),
        ]

    assert anyio.run(statuses) == [200, 403, 200, 404]
