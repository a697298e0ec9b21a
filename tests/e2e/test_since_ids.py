"""`since` ids under real use, without vLLM: eight sessions at once on one HTTP server make far
more snapshots than the old server-wide store kept (32), and every session's first id still
works, also on a restarted server of the same data dir; an id of another data dir is refused."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from graph_kvcache_mcp.services.kv.views import KvStatsOut
from tests.support.engines import RunningEngine
from tests.support.http_server import http_server
from tests.support.mcp_calls import b64, call_error, call_ok, fresh_key

SESSIONS = 8
HTTP_TOKEN = "since-ids-http-token-7c1e4b90d2a35f68"
AUTH = {"Authorization": f"Bearer {HTTP_TOKEN}"}
CALLS_EACH = 8


def _env(engine: RunningEngine, data_dir: Path) -> dict[str, str]:
    return {
        "EPISTEMIC_GRAPH_KVCACHE_URL": engine.base_url,
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": engine.token.get_secret_value(),
        "GRAPH_KVCACHE_DATA_DIR": str(data_dir),
        "GRAPH_KVCACHE_TOOLSETS": "kv",
        "GRAPH_KVCACHE_HTTP_TOKEN": HTTP_TOKEN,
    }


async def _stats(client: Client, since: str | None = None) -> KvStatsOut:
    arguments = {} if since is None else {"since": since}
    return KvStatsOut.model_validate(await call_ok(client, "kv_stats", arguments))


async def _sessions(url: str) -> list[str]:
    """Each session's first id, then puts and stats from all of them at once."""
    ids = [""] * SESSIONS

    async def one(n: int) -> None:
        async with (
            httpx2.AsyncClient(timeout=60, headers=AUTH) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            first = (await _stats(client)).snapshot_id
            assert first is not None
            ids[n] = first
            for _ in range(CALLS_EACH):
                await call_ok(client, "kv_put", {"key": fresh_key("since"), "value_b64": b64(b"x")})
                await _stats(client)

    async with anyio.create_task_group() as group:
        for n in range(SESSIONS):
            group.start_soon(one, n)
    return ids


async def _windows(url: str, ids: list[str]) -> list[KvStatsOut]:
    async with (
        httpx2.AsyncClient(timeout=60, headers=AUTH) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        return [await _stats(client, since) for since in ids]


async def _refused(url: str, since: str) -> str:
    async with (
        httpx2.AsyncClient(timeout=60, headers=AUTH) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        return await call_error(client, "kv_stats", {"since": since})


def test_every_sessions_since_id_outlives_other_sessions_calls_and_a_server_restart(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    env = _env(memory_engine, tmp_path / "data")
    with http_server(env) as server:
        ids = anyio.run(_sessions, server.url)
    assert all(ids)  # and 8 x 9 = 72 snapshots were handed out meanwhile (the old store kept 32)
    with http_server(env) as restarted:
        windows = anyio.run(_windows, restarted.url, ids)
    for window in windows:
        assert window.delta is not None
        assert window.delta.unique_blocks is not None and window.delta.unique_blocks > 0
    with http_server(_env(memory_engine, tmp_path / "other")) as foreign:
        message = anyio.run(_refused, foreign.url, ids[0])
    assert "signature does not match this data dir's key" in message
    assert "call kv_stats without since and pass the snapshot_id it returns" in message
