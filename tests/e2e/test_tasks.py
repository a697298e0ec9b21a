"""Long calls as MCP tasks (the `io.modelcontextprotocol/tasks` extension), driven by the MCP
Python SDK's own client over stdio and HTTP: a client that opts in gets a task at once, polls it
to its result (also from a new HTTP session after the first one left), can cancel a vLLM start
half-way (nothing is left running), and a client that does not opt in gets the call inline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import CallToolResult

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.processes.identity import is_alive
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmState
from graph_kvcache_mcp.services.stack.views import EngineStatusOut
from tests.support.http_server import http_server
from tests.support.processes import clean_env, venv_script, wait_until
from tests.support.task_client import (
    TASKS,
    TasksClientExtension,
    cancel_task,
    get_task,
    start_task,
    wait_ended,
)
from tests.support.vllm import (
    BLOCK_SIZE,
    MODEL_NAME,
    READY_TIMEOUT_S,
    VllmServers,
    offline_environment,
    require_vllm_venv,
    tiny_model_dir,
)

ENGINE_START = {"backend": "memory"}


def _stdio(data_dir: Path, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(venv_script("graph-kvcache-mcp")),
        args=["--data-dir", str(data_dir)],
        env=clean_env(**env),
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data dir whose managed engine (a task started it) is stopped after the test."""
    yield tmp_path
    ManagedEngine(tmp_path).stop(term_wait_s=5.0)


async def test_over_stdio_a_long_call_is_a_task_and_without_the_extension_it_is_inline(
    data_dir: Path,
) -> None:
    async with Client(_stdio(data_dir), extensions=[TasksClientExtension()]) as client:
        advertised = client.session.server_capabilities
        created = await start_task(client, "engine_start", ENGINE_START)
        ended = await wait_ended(client, created.task_id, timeout_s=120)
        with pytest.raises(MCPError) as unknown:
            await get_task(client, "no-such-task")
        quick = await client.session.call_tool("engine_status", {}, allow_claimed=True)
    async with Client(_stdio(data_dir)) as plain:
        inline = await plain.call_tool("engine_start", ENGINE_START)
    assert advertised is not None and advertised.extensions == {TASKS: {}}
    assert created.status == "working" and created.poll_interval_ms and created.ttl_ms
    assert ended.status == "completed" and ended.result is not None
    assert not ended.result.get("isError")
    started = EngineStatusOut.model_validate(ended.result["structuredContent"])
    assert started.running and started.pid is not None
    assert unknown.value.error.code == -32602 and "no task" in unknown.value.error.message
    assert isinstance(quick, CallToolResult)  # a quick tool stays inline for task clients
    assert not inline.is_error and inline.structured_content is not None
    assert inline.structured_content["running"] is True


async def test_over_http_a_task_outlives_the_session_that_opened_it(data_dir: Path) -> None:
    env = {"GRAPH_KVCACHE_DATA_DIR": str(data_dir)}
    with http_server(env, "--no-auth") as server:
        async with Client(server.url, extensions=[TasksClientExtension()]) as first:
            created = await start_task(first, "engine_start", ENGINE_START)
        async with Client(server.url, extensions=[TasksClientExtension()]) as second:
            ended = await wait_ended(second, created.task_id, timeout_s=120)
        async with Client(server.url) as plain:
            with pytest.raises(MCPError) as undeclared:
                await get_task(plain, created.task_id)
            inline = await plain.call_tool("engine_status", {})
    assert ended.status == "completed" and ended.result is not None
    assert EngineStatusOut.model_validate(ended.result["structuredContent"]).running
    assert undeclared.value.error.code == -32021  # tasks/* need the extension declared
    assert not inline.is_error


@pytest.mark.vllm
async def test_cancelling_a_vllm_start_task_stops_the_vllm_it_started(
    tmp_path: Path, vllm_private: VllmServers
) -> None:
    vllm_private.stop_shared()  # one vLLM at a time on this machine
    model_dir = tiny_model_dir()
    env = {
        **offline_environment(tmp_path / "vllm-cache"),
        "GRAPH_KVCACHE_VLLM_PYTHON": str(require_vllm_venv()),
    }
    start = {
        "model": str(model_dir),
        "port": free_port(),
        "served_model_name": MODEL_NAME,
        "max_model_len": 4096,
        "dtype": "bfloat16",
        "block_size": BLOCK_SIZE,
        "kv_cache_memory_bytes": 256 * 1024 * 1024,
        "extra_args": ["--enforce-eager"],
        "ready_timeout_s": READY_TIMEOUT_S,
    }
    managed = ManagedVllm(tmp_path)
    try:
        async with Client(_stdio(tmp_path, **env), extensions=[TasksClientExtension()]) as client:
            created = await start_task(client, "vllm_start", start)
            # Half-way: vLLM has been spawned and the start waits for its /health.
            record = await _spawned(managed, timeout_s=60)
            half_way = await get_task(client, created.task_id)
            await cancel_task(client, created.task_id)
            ended = await wait_ended(client, created.task_id, timeout_s=90)
        assert half_way.status == "working" and half_way.status_message is not None
        assert "vLLM" in half_way.status_message  # the start's own progress, through tasks/get
        assert ended.status == "cancelled", ended
        assert managed.state_file.read() is None
        gone = partial(is_alive, record.process.pid, record.process.start_ticks)
        wait_until(lambda: not gone(), timeout_s=30, what="the cancelled vLLM gone")
    finally:
        managed.stop(term_wait_s=5.0)


async def _spawned(managed: ManagedVllm, *, timeout_s: float) -> VllmState:
    """The record of the vLLM the start spawned, once written (polled, the event loop free)."""
    deadline = time.monotonic() + timeout_s
    while (record := managed.state_file.read()) is None:
        assert time.monotonic() < deadline, f"no vLLM spawned within {timeout_s:g} s"
        await anyio.sleep(0.5)
    return record
