"""Other ways in: `mcp run` on the entry file, streamable HTTP with a bearer token, `demo`, and
the scripted workflow example. Each runs the real console script or interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from graph_kvcache_mcp.connectors.processes.ports import free_port, port_in_use
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from tests.support.engines import RunningEngine, require_in_ci
from tests.support.mcp_calls import call_ok
from tests.support.processes import (
    REPO,
    clean_env,
    running_engine_state,
    venv_script,
    wait_until,
)


def _engine_env(engine: RunningEngine, data_dir: Path) -> dict[str, str]:
    return {
        "EPISTEMIC_GRAPH_KVCACHE_URL": engine.base_url,
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": engine.token.get_secret_value(),
        "GRAPH_KVCACHE_DATA_DIR": str(data_dir),
    }


async def test_mcp_run_on_the_entry_file_starts_and_lists_the_tools(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    mcp_cli = venv_script("mcp")
    if not mcp_cli.exists():
        require_in_ci("the `mcp` CLI (mcp[cli])")
    server = StdioServerParameters(
        command=str(mcp_cli),
        args=["run", str(REPO / "examples" / "mcp_server.py")],
        env=_engine_env(memory_engine, tmp_path),
    )
    async with Client(server, mode="legacy") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        stats = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
        status = await call_ok(client, "engine_status", {})
    assert {"kv_stats", "kv_probe", "kv_get", "toolsets", "engine_status"} <= names
    assert stats.reachable and stats.base_url == memory_engine.base_url
    assert status["kv_source"] == "configured"


def test_http_transport_requires_the_bearer_token(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    port, token = free_port(), "e2e-http-token-0123456789abcdef"
    command = [str(venv_script("graph-kvcache-mcp")), "serve", "--transport", "http"]
    server = subprocess.Popen(
        [*command, "--port", str(port), "--http-token"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(GRAPH_KVCACHE_HTTP_TOKEN=token, **_engine_env(memory_engine, tmp_path)),
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_until(lambda: port_in_use("127.0.0.1", port), timeout_s=30, what="the HTTP port")
        refused, names, stats = anyio.run(_talk_http, url, token)
    finally:
        server.terminate()
        out, err = server.communicate(timeout=20)
    assert refused == 401
    assert "kv_probe" in names and stats.reachable
    assert token not in out.decode() + err.decode()


async def _talk_http(url: str, token: str) -> tuple[int, set[str], KvStatsOut]:
    async with httpx2.AsyncClient() as anonymous:
        refused = await anonymous.post(url, json={})
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers) as authorized,
        Client(streamable_http_client(url, http_client=authorized)) as client,
    ):
        names = {tool.name for tool in (await client.list_tools()).tools}
        stats = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
    return refused.status_code, names, stats


def test_demo_runs_the_workflow_and_leaves_no_engine_behind(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(venv_script("graph-kvcache-mcp")), "demo", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(EPISTEMIC_GRAPH_KVCACHE_URL="http://127.0.0.1:9"),  # must be ignored
    )
    assert done.returncode == 0, done.stdout + done.stderr
    steps = ("1. kv_stats", "2. kv_put", "3. kv_get", "4. kv_probe", "5. kv_stats")
    beyond = ("6. bundle_compile", "7. bundle_compile", "8. diagnose_budget", "9. diagnose_stack")
    for step in (*steps, *beyond):
        assert step in done.stdout
    assert "hello from the graph-kvcache-mcp demo" in done.stdout
    assert "served from the KV store" in done.stdout  # the second compile hit the cache
    assert "bytes of KV per token" in done.stdout
    assert "-> checked engine up, vllm " in done.stdout and " findings" in done.stdout
    assert "done: every step answered as expected" in done.stdout
    assert running_engine_state(tmp_path) is None


def test_demo_on_a_fresh_machine_uses_and_removes_a_temporary_data_dir(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(venv_script("graph-kvcache-mcp")), "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(HOME=str(tmp_path)),  # nothing configured, empty home
    )
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("cleaned up:") and "removed" in last
    data_dir = Path(last.rsplit("; ", 1)[1].removesuffix(" removed"))
    assert data_dir.name.startswith("graph-kvcache-demo-") and not data_dir.exists()
    assert not (tmp_path / ".local").exists()  # the default data dir was not touched


@pytest.mark.parametrize("configured", [False, True], ids=["embedded", "configured"])
def test_scripted_workflow_example_runs_to_the_end(
    memory_engine: RunningEngine, configured: bool, tmp_path: Path
) -> None:
    env = (
        _engine_env(memory_engine, tmp_path)
        if configured
        else {"GRAPH_KVCACHE_DATA_DIR": str(tmp_path)}
    )
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "scripted_workflow.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(**env),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matches: True" in done.stdout and "all checks passed" in done.stdout
    expected = memory_engine.base_url if configured else "backend at http://127.0.0.1:"
    assert expected in done.stdout
    assert running_engine_state(tmp_path) is None
