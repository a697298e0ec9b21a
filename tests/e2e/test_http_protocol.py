"""Over streamable HTTP, a body that is not one JSON-RPC message gets the JSON-RPC error the spec
names (with its id where one can be read) and no session id; the same protocol errors as on
stdio (initialize first, a second initialize refused, params naming the field) hold here too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.support.http_server import HttpServer, http_server
from tests.support.stdio_raw import INITIALIZE

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}

RAW: dict[str, tuple[bytes, int, Any]] = {
    "not JSON": (b"this is not json", -32700, None),
    "lone surrogate": (
        b'{"jsonrpc":"2.0","id":3,"method":"ping","params":{"a":"\\ud83d"}}',
        -32700,
        3,
    ),
    "batch": (b'[{"jsonrpc":"2.0","id":11,"method":"ping"}]', -32600, 11),
    "params as a string": (b'{"jsonrpc":"2.0","id":4,"method":"ping","params":"s"}', -32600, 4),
    "id without method": (b'{"jsonrpc":"2.0","id":5}', -32600, 5),
    "no session": (b'{"jsonrpc":"2.0","id":6,"method":"tools/list"}', -32600, 6),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    data_dir = tmp_path_factory.mktemp("http-protocol")
    with http_server(
        {"GRAPH_KVCACHE_DATA_DIR": str(data_dir)}, "--no-auth", "--toolsets", "kv"
    ) as up:
        yield up


def _post(server: HttpServer, body: bytes, **headers: str) -> httpx2.Response:
    return httpx2.post(server.url, content=body, headers={**HEADERS, **headers}, timeout=30.0)


def _json_or_sse(response: httpx2.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        answer: dict[str, Any] = json.loads(data[-1])
        return answer
    answer = response.json()
    return answer


@pytest.mark.parametrize("case", sorted(RAW))
def test_a_body_that_is_not_one_message_gets_the_spec_s_error_and_no_session(
    server: HttpServer, case: str
) -> None:
    body, code, found = RAW[case]
    answer = _post(server, body)
    assert answer.status_code == 400
    assert "mcp-session-id" not in answer.headers
    error = answer.json()
    assert error["id"] == found and error["error"]["code"] == code
    assert "validation error" not in error["error"]["message"].lower()
    assert "pydantic" not in answer.text


def test_a_second_initialize_on_an_http_session_is_refused(server: HttpServer) -> None:
    first = _post(server, json.dumps(INITIALIZE).encode())
    session = first.headers["mcp-session-id"]
    assert "result" in _json_or_sse(first)
    again = _post(
        server, json.dumps({**INITIALIZE, "id": "again"}).encode(), **{"mcp-session-id": session}
    )
    error = _json_or_sse(again)
    assert error["id"] == "again" and error["error"]["code"] == -32600
    assert "already initialized" in error["error"]["message"]


def test_a_large_malformed_body_is_refused_without_its_id_and_no_session(
    server: HttpServer,
) -> None:
    big = b'{"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":"' + b"x" * 2_000_000 + b'"'
    answer = _post(server, big)  # cut JSON, past the 1 MiB the rewriter keeps
    assert answer.status_code == 400 and "mcp-session-id" not in answer.headers
    error = answer.json()
    assert error["id"] is None and error["error"]["code"] == -32700
