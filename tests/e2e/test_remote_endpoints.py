"""A plain-http vLLM on a LAN address, staged in a network namespace this test creates: the
address 10.0.0.18/32 on the namespace's own loopback device, a vLLM double listening there (a
real vLLM takes minutes to start on CPU; the double records what reaches it), and the real
server under test started over stdio inside the same namespace with its own managed engine.

Without the opt-in the server still starts and serves the KV tools, the vLLM tools say why they
are refused, and nothing (no API key) reaches the address. With the address or its CIDR in
GRAPH_KVCACHE_INSECURE_HTTP_HOSTS the vLLM tools reach it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from graph_kvcache_mcp.domain.endpoints import INSECURE_HOSTS_ENV
from tests.support.engines import require_in_ci
from tests.support.mcp_calls import b64, call_error, call_ok, fresh_key
from tests.support.processes import REPO, clean_env, venv_script

LAN_ADDRESS = "10.0.0.18"
API_KEY = "vllm-api-key-remote-endpoints-7d1e90"
# Runs as the namespace's first process: address up, double listening (the FIFO read waits for
# it), then `exec` so the server keeps this pid and the double dies with it.
STAGE = """
set -e
ip link set lo up
ip addr add "$1/32" dev lo
mkfifo "$4"
"$2" -m tests.support.vllm_double "$1" 8000 "$3" "$4" </dev/null >/dev/null 2>&1 &
read ready < "$4"
exec "$5"
"""


def _namespace_prefix() -> list[str]:
    # As root a plain network namespace will do; otherwise map us to root in a user namespace.
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    try:
        probe = subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], capture_output=True)
    except FileNotFoundError:
        require_in_ci("unshare and ip (util-linux, iproute2)")
    if probe.returncode != 0:
        require_in_ci(f"network namespaces ({probe.stderr.decode().strip()})")
    return prefix


@pytest.mark.parametrize(
    "listed",
    [None, "10.0.0.19", LAN_ADDRESS, "10.0.0.0/24"],
    ids=["no-opt-in", "other-host-listed", "host-listed", "cidr-listed"],
)
async def test_a_plain_http_vllm_on_a_lan_address_is_used_only_when_its_host_is_listed(
    tmp_path: Path, listed: str | None
) -> None:
    prefix = _namespace_prefix()
    requests_log = tmp_path / "double-requests.jsonl"
    requests_log.touch()
    env = clean_env(
        GRAPH_KVCACHE_DATA_DIR=str(tmp_path / "data"),
        VLLM_BASE_URL=f"http://{LAN_ADDRESS}:8000/v1",
        VLLM_API_KEY=API_KEY,
        **({INSECURE_HOSTS_ENV: listed} if listed else {}),
    )
    stage = [
        *("sh", "-c", STAGE, "stage", LAN_ADDRESS, sys.executable, str(requests_log)),
        *(str(tmp_path / "ready"), str(venv_script("graph-kvcache-mcp"))),
    ]
    server = StdioServerParameters(
        command=prefix[0], args=[*prefix[1:], *stage], env=env, cwd=str(REPO)
    )
    allowed = listed in {LAN_ADDRESS, "10.0.0.0/24"}
    async with Client(server, mode="legacy") as client:
        put = await call_ok(client, "kv_put", {"key": fresh_key("ns"), "value_b64": b64(b"x")})
        if allowed:
            metrics = await call_ok(client, "vllm_metrics", {})
        else:
            refused = await call_error(client, "vllm_metrics", {})
    seen = [json.loads(line) for line in requests_log.read_text().splitlines()]
    assert put["state"] == "stored_new"  # the KV side serves either way
    if allowed:
        assert metrics["reachable"] and metrics["metrics_url"].startswith(f"http://{LAN_ADDRESS}")
        assert metrics["snapshot"]["prefix_cache_queries_tokens"] is not None
        assert {request["path"] for request in seen} >= {"/metrics"}
        assert all(request["authorization"] == f"Bearer {API_KEY}" for request in seen)
    else:
        assert "disabled on this server" in refused and INSECURE_HOSTS_ENV in refused
        assert "https://" in refused and API_KEY not in refused
        assert seen == []  # not one request, so the key never crossed in clear
