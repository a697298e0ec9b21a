"""`serve` flag handling and the HTTP bearer-token gate (driven as a real ASGI app)."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.cli import build_parser
from graph_kvcache_mcp.commands._common import settings_from_args
from graph_kvcache_mcp.commands.serve import default_to_serve
from graph_kvcache_mcp.host.http_app import BearerTokenGate

TOKEN = "t0ps3cret-token-value"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ["serve"]),
        (["--read-only"], ["serve", "--read-only"]),
        (["--toolsets", "kv", "--keep-engine"], ["serve", "--toolsets", "kv", "--keep-engine"]),
        (["kv", "stats"], ["kv", "stats"]),
        (["serve", "--transport", "http"], ["serve", "--transport", "http"]),
        (["--version"], ["--version"]),
        (["-h"], ["-h"]),
    ],
)
def test_no_command_means_serve_over_stdio(argv: list[str], expected: list[str]) -> None:
    assert default_to_serve(argv) == expected


def test_server_flags_become_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "EPISTEMIC_GRAPH_KVCACHE_URL",
        "GRAPH_KVCACHE_READ_ONLY",
        "GRAPH_KVCACHE_TOOLSETS",
    ):
        monkeypatch.delenv(name, raising=False)
    argv = ["--read-only", "--toolsets", "kv,engine", "--start-engine", "--keep-engine"]
    args = build_parser().parse_args(default_to_serve([*argv, "--data-dir", str(tmp_path)]))
    settings = settings_from_args(args)
    assert (args.command, args.transport) == ("serve", "stdio")
    assert settings.read_only and settings.start_engine and settings.keep_engine
    assert settings.toolsets == ("kv", "engine") and settings.data_dir == tmp_path


def test_unset_server_flags_leave_the_environment_in_charge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRAPH_KVCACHE_READ_ONLY", "true")
    settings = settings_from_args(build_parser().parse_args(default_to_serve([])))
    assert settings.read_only is True


async def _request(
    gate: BearerTokenGate, headers: list[tuple[bytes, bytes]], *, path: str = "/mcp"
) -> list[Any]:
    sent: list[Any] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    await gate(scope, receive, send)
    return sent


async def _ok_app(scope: Any, receive: Any, send: Any) -> None:
    """The downstream app: answers 200 to whatever reaches it."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"authorization", b"Bearer wrong")],
        [(b"authorization", TOKEN.encode())],
        [(b"x-token", f"Bearer {TOKEN}".encode())],
        [(b"authorization", f"Basic {TOKEN}".encode())],
        [(b"authorization", b"Bearer ")],
    ],
    ids=["missing", "wrong", "no-scheme", "other-header", "basic-scheme", "empty"],
)
async def test_the_gate_answers_401_without_the_right_bearer_token(
    headers: list[tuple[bytes, bytes]],
) -> None:
    sent = await _request(BearerTokenGate(_ok_app, SecretStr(TOKEN)), headers)
    assert sent[0]["status"] == 401
    assert (b"www-authenticate", b'Bearer realm="graph-kvcache-mcp"') in sent[0]["headers"]
    assert TOKEN.encode() not in sent[1]["body"]
    assert b"Authorization: Bearer <token>" in sent[1]["body"]


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_the_gate_passes_requests_with_the_token_in_any_scheme_case(scheme: str) -> None:
    gate = BearerTokenGate(_ok_app, SecretStr(TOKEN))
    sent = await _request(gate, [(b"Authorization", f"{scheme} {TOKEN}".encode())])
    assert (sent[0]["status"], sent[1]["body"]) == (200, b"ok")
    assert TOKEN not in repr(gate)


@pytest.mark.parametrize(
    "path",
    [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration",
    ],
)
async def test_oauth_discovery_answers_404_with_or_without_a_token(path: str) -> None:
    gate = BearerTokenGate(_ok_app, SecretStr(TOKEN))
    for headers in ([], [(b"authorization", f"Bearer {TOKEN}".encode())]):
        sent = await _request(gate, headers, path=path)
        assert sent[0]["status"] == 404


def test_no_auth_and_http_token_cannot_be_given_together() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--transport", "http", "--no-auth", "--http-token"])
