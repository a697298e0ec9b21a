"""The `toolsets` tool over the real transports: a client enables an opt-in toolset at run time,
the `notifications/tools/list_changed` arrives, a following tools/list has the new tools, and
calling one works; enabling twice or an unknown name is a clear tool error. Driven by the Python
SDK's Client and by the TypeScript SDK's (Node, from npm), over stdio and HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ToolListChangedNotification

from graph_kvcache_mcp.tools.toolsets import ToolsetsOut
from tests.support.engines import RunningEngine, require_in_ci
from tests.support.http_server import http_server
from tests.support.mcp_calls import call_error, call_ok
from tests.support.processes import clean_env, venv_script


def _engine_env(engine: RunningEngine, data_dir: Path) -> dict[str, str]:
    return {
        "EPISTEMIC_GRAPH_KVCACHE_URL": engine.base_url,
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": engine.token.get_secret_value(),
        "GRAPH_KVCACHE_DATA_DIR": str(data_dir),
    }


class ListChanges:
    """A client message handler that counts tools/list_changed notifications."""

    def __init__(self) -> None:
        self.count = 0
        self.arrived = anyio.Event()

    async def __call__(self, message: object) -> None:
        if isinstance(message, ToolListChangedNotification):
            self.count += 1
            self.arrived.set()


async def _enable_lmcache_and_use_it(client: Client, changes: ListChanges) -> None:
    assert client.server_capabilities is not None
    tools = client.server_capabilities.tools
    assert tools is not None and tools.list_changed is True
    before = {tool.name for tool in (await client.list_tools()).tools}
    assert {"toolsets", "graph_kvcache"} <= before and "lmcache_status" not in before
    listing = ToolsetsOut.model_validate(await call_ok(client, "toolsets", {}))
    offered = {line.name for line in listing.toolsets if not line.enabled}
    assert {"lmcache", "fleet"} <= offered and "compat" not in offered

    enabled = ToolsetsOut.model_validate(await call_ok(client, "toolsets", {"enable": "lmcache"}))
    assert enabled.enabled_now == "lmcache" and "lmcache_status" in enabled.tools_added
    with anyio.fail_after(10):  # sent on the call's own stream: normally already here
        await changes.arrived.wait()
    after = {tool.name for tool in (await client.list_tools()).tools}
    assert after - before == set(enabled.tools_added)
    status = await call_ok(client, "lmcache_status", {})
    assert status["running"] is False  # nothing started one in this data dir

    again = await call_error(client, "toolsets", {"enable": "lmcache"})
    assert "'lmcache' is already enabled" in again
    unknown = await call_error(client, "toolsets", {"enable": "kv_everything"})
    assert "unknown toolset 'kv_everything'" in unknown and "fleet" in unknown
    assert changes.count == 1  # the refusals announce nothing


async def test_stdio_client_enables_a_toolset_and_hears_the_list_changed(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    server = StdioServerParameters(
        command=str(venv_script("graph-kvcache-mcp")), env=_engine_env(memory_engine, tmp_path)
    )
    changes = ListChanges()
    async with Client(server, mode="legacy", message_handler=changes) as client:
        await _enable_lmcache_and_use_it(client, changes)


async def test_http_client_enables_a_toolset_and_hears_the_list_changed(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    changes = ListChanges()
    with http_server(_engine_env(memory_engine, tmp_path), "--no-auth") as up:
        async with (
            httpx2.AsyncClient() as http,
            Client(
                streamable_http_client(up.url, http_client=http),
                mode="legacy",
                message_handler=changes,
            ) as client,
        ):
            await _enable_lmcache_and_use_it(client, changes)


TS_SDK = "@modelcontextprotocol/sdk@1.32.2"
TS_CLIENT = Path(__file__).parents[1] / "support" / "ts_toolsets_client.cjs"


def _ts_client(*target: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    if shutil.which("npx") is None:
        require_in_ci("npx (Node.js)")
    done = subprocess.run(
        ["npx", "-y", "-p", TS_SDK, "--", "node", str(TS_CLIENT), *target],
        capture_output=True,
        text=True,
        timeout=300,  # the first run downloads the SDK
        cwd=cwd,
        env=clean_env(**env),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def _assert_ts_client_saw_the_toolset_arrive(seen: dict[str, Any]) -> None:
    assert seen["list_changed_declared"] is True
    assert "lmcache_status" not in seen["before"] and "toolsets" in seen["before"]
    added = set(seen["enabled"]["tools_added"])
    assert set(seen["after"]) - set(seen["before"]) == added and "lmcache_status" in added
    assert seen["changes"] == 1
    assert seen["stats_error"] is False and seen["stats"]["running"] is False
    assert seen["again_error"] is True and "already enabled" in seen["again_text"]


def test_typescript_sdk_client_over_stdio_hears_the_list_changed(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    env = _engine_env(memory_engine, tmp_path)
    seen = _ts_client("stdio", str(venv_script("graph-kvcache-mcp")), cwd=tmp_path, env=env)
    _assert_ts_client_saw_the_toolset_arrive(seen)


def test_typescript_sdk_client_over_http_hears_the_list_changed(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    with http_server(_engine_env(memory_engine, tmp_path), "--no-auth") as up:
        seen = _ts_client("http", up.url, cwd=tmp_path, env={})
    _assert_ts_client_saw_the_toolset_arrive(seen)
