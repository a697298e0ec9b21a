"""The owner-only filters in front of LMCache's HTTP apps and a dev-mode vLLM, over real loopback
connections: a request our user's socket made is served, one no socket of ours made is refused,
a joined server's coordinator callbacks included, and of deletes only an unforced L1 one.
(`nobody`'s own requests: the coordinator, stack and vLLM neighbour tests.)"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from graph_kvcache_mcp.domain.fleet.tier_trust import REPORTED_INSTANCE_ROUTE
from graph_kvcache_mcp.domain.lmcache.process_spec import flag_value
from graph_kvcache_mcp.domain.vllm.entry import DEV_ROUTES_FILTER
from graph_kvcache_mcp.plugins.lmcache.server import AdminRoutesOnly
from graph_kvcache_mcp.plugins.owner_only import OwnerOnly, from_owner
from graph_kvcache_mcp.plugins.vllm_dev_routes import OwnerOnlyDevRoutes


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


async def _status(app: Any, scope: Any, body: bytes = b"") -> int:
    return (await _answer(app, scope, body))[0]


async def _answer(app: Any, scope: Any, body: bytes = b"") -> tuple[int, bytes]:
    """The status and body the filtered app answers; the inner app echoes the body it read."""
    sent: list[Any] = []

    async def inner(_scope: Any, receive: Any, send: Any) -> None:
        read = b""
        while True:
            message = await receive()
            read += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": read})

    async def send(message: Any) -> None:
        sent.append(message)

    # the body in two parts: the filter must read it whole and hand it on whole
    parts = [body[: len(body) // 2], body[len(body) // 2 :]]

    async def receive() -> Any:
        part = parts.pop(0) if parts else b""
        return {"type": "http.request", "body": part, "more_body": bool(parts)}

    await app(inner)(scope, receive, send)
    echoed = b"".join(m.get("body", b"") for m in sent[1:])
    return int(sent[0]["status"]), echoed


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
                b'{"keys": [], "tier": "l1"}',
            ),
            await _status(
                lambda app: AdminRoutesOnly(app, coordinator=True),
                _scope(stranger, server, "DELETE", "/cache/objects"),
            ),
        ]

    assert anyio.run(statuses) == [200, 403, 200, 404]


L1 = {"keys": [], "tier": "l1"}


@pytest.mark.parametrize(
    ("body", "served"),
    [
        (L1, True),
        ({**L1, "force": False}, True),
        ({**L1, "force": True}, False),  # a neighbour's coordinator request dropping chunks in use
        ({"keys": []}, False),  # LMCache's default tier is l2
        ({**L1, "tier": "l2"}, False),  # through the resp adapter: engine data gone
        ({**L1, "tier": "all"}, False),
        ([], False),
    ],
)
def test_a_joined_server_serves_an_unforced_l1_delete_only(
    connection: tuple[tuple[str, int], tuple[str, int]], body: Any, served: bool
) -> None:
    client, server = connection
    raw = json.dumps(body).encode()
    status, echoed = anyio.run(
        _answer,
        lambda app: AdminRoutesOnly(app, coordinator=True),
        _scope(client, server, "DELETE", "/cache/objects"),
        raw,
    )
    assert (status, echoed) == (
        (200, raw)
        if served
        else (403, b'{"detail": "Forbidden: only an unforced tier=l1 delete is served"}')
    )


def test_the_server_reports_its_instance_id_to_its_owner_only(
    connection: tuple[tuple[str, int], tuple[str, int]],
) -> None:
    client, server = connection
    reporting = lambda app: AdminRoutesOnly(app, instance_id="ours-1")  # noqa: E731
    owner = anyio.run(_answer, reporting, _scope(client, server, "GET", REPORTED_INSTANCE_ROUTE))
    stranger = anyio.run(
        _answer, reporting, _scope(("127.0.0.1", 1), server, "GET", REPORTED_INSTANCE_ROUTE)
    )
    assert owner == (200, b'{"instance_id": "ours-1"}')
    assert stranger[0] == 404
    lifespan: list[Any] = []

    async def app(scope: Any, _receive: Any, _send: Any) -> None:
        lifespan.append(scope["type"])

    anyio.run(AdminRoutesOnly(app, instance_id="ours-1"), {"type": "lifespan"}, None, None)
    assert lifespan == ["lifespan"]  # startup reaches LMCache's app (no path to look at)
    assert flag_value(["--instance-id", "a"], "--instance-id") == "a"
    assert flag_value(["--instance-id=b"], "--instance-id") == "b"
    assert flag_value(["--port", "1"], "--instance-id") is None


def test_a_dev_mode_vllm_serves_its_dev_routes_to_its_owner_only(
    connection: tuple[tuple[str, int], tuple[str, int]],
) -> None:
    client, server = connection
    stranger = ("127.0.0.1", 1)
    module, name = DEV_ROUTES_FILTER.rsplit(".", 1)
    assert getattr(__import__(module, fromlist=[name]), name) is OwnerOnlyDevRoutes

    async def statuses(caller: tuple[str, int]) -> list[int]:
        return [
            await _status(OwnerOnlyDevRoutes, _scope(caller, server, method, path))
            for method, path in (
                ("POST", "/collective_rpc"),
                ("POST", "/update_weights"),
                ("POST", "/sleep"),
                ("POST", "/reset_prefix_cache"),
                ("GET", "/server_info"),
                ("GET", "/v1/models"),  # vLLM's key guards these for everyone
                ("GET", "/health"),
            )
        ]

    assert anyio.run(statuses, client) == [200] * 7
    assert anyio.run(statuses, stranger) == [403] * 5 + [200] * 2
