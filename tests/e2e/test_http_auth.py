"""The HTTP transport, run as the real console script: a bearer token by default (from the
environment or a generated private file), `--no-auth` as the only way off, OAuth discovery
answering 404, and request bodies large enough for a 10 MiB value."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from graph_kvcache_mcp.connectors.files.http_token import TOKEN_FILE_NAME
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from tests.support.engines import RunningEngine
from tests.support.http_server import http_server
from tests.support.mcp_calls import b64, call_ok, fresh_key

TOKEN = "e2e-http-auth-token-5f0c2a9d41b7e3"
BIG_VALUE_BYTES = 10 * 1024 * 1024


def _engine_env(engine: RunningEngine, data_dir: Path) -> dict[str, str]:
    return {
        "EPISTEMIC_GRAPH_KVCACHE_URL": engine.base_url,
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": engine.token.get_secret_value(),
        "GRAPH_KVCACHE_DATA_DIR": str(data_dir),
    }


async def _anonymous(url: str, path: str = "") -> httpx2.Response:
    async with httpx2.AsyncClient() as anonymous:
        if path:
            return await anonymous.get(url.removesuffix("/mcp") + path)
        return await anonymous.post(url, json={})


async def _put_and_stats(
    url: str, header: str | None, value: bytes
) -> tuple[dict[str, object], KvStatsOut]:
    headers = {"Authorization": header} if header else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        put = await call_ok(client, "kv_put", {"key": fresh_key("http"), "value_b64": b64(value)})
        stats = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
    return put, stats


def test_an_environment_token_alone_turns_auth_on_and_a_10_mib_value_fits(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    env = {"GRAPH_KVCACHE_HTTP_TOKEN": TOKEN, **_engine_env(memory_engine, tmp_path)}
    value = os.urandom(BIG_VALUE_BYTES)
    with http_server(env) as server:
        refused = anyio.run(_anonymous, server.url)
        discovery = [
            anyio.run(_anonymous, server.url, path).status_code
            for path in (
                "/.well-known/oauth-protected-resource/mcp",
                "/.well-known/oauth-authorization-server",
            )
        ]
        put, stats = anyio.run(_put_and_stats, server.url, f"bearer {TOKEN}", value)
    assert refused.status_code == 401
    assert "Authorization: Bearer <token>" in refused.json()["hint"]
    assert discovery == [404, 404]
    assert (put["state"], put["size_bytes"]) == ("stored_new", BIG_VALUE_BYTES)
    assert stats.reachable
    assert "GRAPH_KVCACHE_HTTP_TOKEN" in server.stderr and TOKEN not in server.stderr


def test_without_a_token_setting_two_servers_share_one_generated_private_token(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    env = _engine_env(memory_engine, tmp_path)
    with http_server(env) as first, http_server(env, "--http-token") as second:
        token_file = tmp_path / TOKEN_FILE_NAME
        token = token_file.read_text().strip()
        results = [
            anyio.run(_put_and_stats, server.url, f"Bearer {token}", b"generated")[1]
            for server in (first, second)
        ]
        refused = anyio.run(_anonymous, first.url)
    assert refused.status_code == 401
    assert all(stats.reachable for stats in results)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    for server in (first, second):
        assert str(token_file) in server.stderr and token not in server.stderr
    assert "generated into" in first.stderr + second.stderr
    assert "read from" in first.stderr + second.stderr


def test_no_auth_serves_without_a_token_and_warns(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    with http_server(_engine_env(memory_engine, tmp_path), "--no-auth") as server:
        _, stats = anyio.run(_put_and_stats, server.url, None, b"open")
        discovery = anyio.run(_anonymous, server.url, "/.well-known/oauth-protected-resource")
    assert stats.reachable and discovery.status_code == 404
    assert "warning: --no-auth" in server.stderr
    assert not (tmp_path / TOKEN_FILE_NAME).exists()
