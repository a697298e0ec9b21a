"""Slow-loris against `serve --transport http`, staged for real: another local user (`nobody`)
opens more half-open connections than one user may hold and never finishes their headers."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from graph_kvcache_mcp.host.http_guard import HEADER_TIMEOUT_S, PER_USER_CONNECTIONS
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from tests.support.engines import RunningEngine, require_in_ci
from tests.support.http_server import http_server
from tests.support.mcp_calls import call_ok

TOKEN = "e2e-http-limits-token-8c1d5b7e29a4"
SLOW_LORIS = Path(__file__).resolve().parents[1] / "support" / "slow_loris.py"
ATTACKERS = PER_USER_CONNECTIONS + 40
SLACK_S = 20.0
"""Generous: how long past the header deadline the server may take to close (a loaded host)."""
CROWD = 20_000
"""TIME_WAIT rows in the kernel's TCP table before the attack, as a test suite leaves behind
(every engine call is its own connection): the per-user lookup must not slow down with them."""


def _crowd_tcp_table(rows: int) -> None:
    """Leave `rows` closed loopback connections in TIME_WAIT (they stay about a minute)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4096)
        for _ in range(rows):
            socket.create_connection(listener.getsockname()).close()
            listener.accept()[0].close()


async def _stats(url: str) -> KvStatsOut:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        return KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))


def test_half_open_connections_of_another_user_are_capped_and_timed_out(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    if (
        os.geteuid() != 0
        or not shutil.which("setpriv")
        or not os.access("/usr/bin/python3", os.X_OK)
    ):
        require_in_ci("root with setpriv and /usr/bin/python3 (a second local user)")
    env = {
        "GRAPH_KVCACHE_HTTP_TOKEN": TOKEN,
        "EPISTEMIC_GRAPH_KVCACHE_URL": memory_engine.base_url,
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": memory_engine.token.get_secret_value(),
        "GRAPH_KVCACHE_DATA_DIR": str(tmp_path),
    }
    with http_server(env) as server:
        port = server.url.split(":")[2].split("/")[0]
        wait_s = HEADER_TIMEOUT_S + SLACK_S
        _crowd_tcp_table(CROWD)
        attacker = subprocess.Popen(
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "/usr/bin/python3",
                str(SLOW_LORIS),
                port,
                str(ATTACKERS),
                str(wait_s),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert attacker.stdout is not None
        assert attacker.stdout.readline().strip() == "open"
        stats = anyio.run(_stats, server.url)  # served while nobody's connections hang
        closed = json.loads(attacker.communicate(timeout=wait_s + 30)[0])
    assert stats.reachable
    over_cap = ATTACKERS - PER_USER_CONNECTIONS
    # Refused at once: well before any header deadline, however crowded the TCP table is.
    assert len([t for t in closed if t < HEADER_TIMEOUT_S / 2]) >= over_cap, closed
    assert len(closed) == ATTACKERS, f"{ATTACKERS - len(closed)} half-open connections stayed"
    assert server.stderr.count("refused connections over the cap") <= 3
    assert "Traceback" not in server.stderr and len(server.stderr) < 20_000
