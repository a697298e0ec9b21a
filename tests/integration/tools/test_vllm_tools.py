"""The vllm_* tools through a real MCP Client, against a real vLLM serving the tiny model."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.trace_log import append_traces
from graph_kvcache_mcp.connectors.processes.ports import free_port, port_in_use
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmLogs
from graph_kvcache_mcp.domain.vllm.traces import Trace
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.vllm.views import (
    VllmChatOut,
    VllmMetricsOut,
    VllmResetOut,
    VllmStatusOut,
    VllmTraceSummaryOut,
)
from tests.support.mcp_calls import MODES, call_error, call_ok
from tests.support.peers import slow_peer
from tests.support.vllm import BLOCK_SIZE, VLLM_PYTHON, RunningVllm, VllmServers
from tests.support.vllm_peers import proxy_page_peer

LIFECYCLE = {"vllm_start", "vllm_stop", "vllm_reset_prefix_cache", "vllm_restart_reuse"}


def tool_settings(server: RunningVllm, **extra: Any) -> Settings:
    return server.settings.model_copy(update={"toolsets": ("vllm",), **extra})


def long_system() -> str:
    rules = " ".join(f"Guideline {i}: prefer short answers with sources." for i in range(70))
    return f"Run {uuid.uuid4().hex}. {rules}"


async def chat(client: Client, **arguments: Any) -> VllmChatOut:
    out = VllmChatOut.model_validate(
        await call_ok(client, "vllm_chat", {"max_tokens": 4, **arguments})
    )
    assert out.reachable, out.reason
    return out


@pytest.mark.vllm
@MODES
async def test_vllm_chat_traces_cache_hits_on_a_repeated_prefix_and_the_session_summary_adds_up(
    mode: str, vllm_server: RunningVllm
) -> None:
    system = long_system()
    async with Client(build_server(tool_settings(vllm_server)), mode=mode) as client:
        first = await chat(client, system=system, message="first")
        second = await chat(client, system=system, message="second", stream=True)
        summary = VllmTraceSummaryOut.model_validate(
            await call_ok(client, "vllm_trace_summary", {})
        )
    assert first.trace is not None and second.trace is not None
    assert first.answer is not None and first.trace.completion_tokens == 4
    assert first.trace.prefix_cache_hit_tokens == 0
    hit = second.trace.prefix_cache_hit_tokens
    assert hit is not None and hit > 0 and hit % BLOCK_SIZE == 0
    assert second.trace.cached_tokens_source == "usage"
    assert second.trace.ttft_s is not None
    assert summary.source == "session"
    assert summary.summary.calls == 2
    assert summary.summary.total_tokens_saved == hit
    assert summary.summary.calls_by_source == {"usage": 2}


@pytest.mark.vllm
async def test_vllm_metrics_since_an_earlier_snapshot_reports_what_one_call_moved(
    vllm_server: RunningVllm,
) -> None:
    async with Client(build_server(tool_settings(vllm_server))) as client:
        before = VllmMetricsOut.model_validate(await call_ok(client, "vllm_metrics", {}))
        assert before.snapshot is not None
        done = await chat(client, system=long_system(), message="measure me")
        assert done.trace is not None
        with anyio.fail_after(5):
            while True:  # vLLM publishes a request's stats a moment after answering it
                since = {"since": before.snapshot_id}
                after = VllmMetricsOut.model_validate(await call_ok(client, "vllm_metrics", since))
                assert after.delta is not None
                if after.delta.prompt_tokens == done.trace.prompt_tokens:
                    break
                await anyio.sleep(0.02)
    assert before.reachable and before.metrics_url.endswith("/metrics")
    assert before.snapshot.model_name == vllm_server.model
    assert before.snapshot.cache_config is not None
    assert before.snapshot.cache_config.block_size == BLOCK_SIZE
    assert after.delta.prefix_cache_queries_tokens == done.trace.prompt_tokens
    assert after.delta.prefix_cache_hits_tokens == 0
    assert after.delta.counter_reset is False


@pytest.mark.vllm
async def test_vllm_metrics_for_an_unknown_model_names_the_served_ones(
    vllm_server: RunningVllm,
) -> None:
    async with Client(build_server(tool_settings(vllm_server))) as client:
        message = await call_error(client, "vllm_metrics", {"model": "nope"})
    assert "nope" in message and vllm_server.model in message


@pytest.mark.vllm
async def test_vllm_status_and_logs_describe_the_managed_server(vllm_server: RunningVllm) -> None:
    async with Client(build_server(tool_settings(vllm_server))) as client:
        status = VllmStatusOut.model_validate(await call_ok(client, "vllm_status", {}))
        logs = VllmLogs.model_validate(await call_ok(client, "vllm_logs", {"lines": 20}))
    assert (status.running, status.reachable, status.managed_by_us) == (True, True, True)
    assert status.pid == vllm_server.pid
    assert status.served_models == [vllm_server.model]
    assert status.platform is not None and status.platform.kind == "cpu"
    assert any("--block-size 32" in note for note in status.notes)
    assert status.tools_base_url == vllm_server.base_url
    assert logs.exists and 0 < logs.lines <= 20


@pytest.mark.vllm
async def test_vllm_start_on_a_healthy_server_reuses_it_and_starts_nothing(
    vllm_server: RunningVllm,
) -> None:
    arguments = {
        "model": str(vllm_server.model_dir),
        "port": vllm_server.port,
        "served_model_name": vllm_server.model,
    }
    async with Client(build_server(tool_settings(vllm_server))) as client:
        status = VllmStatusOut.model_validate(await call_ok(client, "vllm_start", arguments))
    assert (status.reused, status.managed_by_us, status.pid) == (True, True, vllm_server.pid)
    state = vllm_server.managed.running_state()
    assert state is not None and state.process.pid == vllm_server.pid


@pytest.mark.vllm
async def test_vllm_reset_prefix_cache_makes_the_same_prefix_cold_again(
    vllm_server: RunningVllm,
) -> None:
    system = long_system()
    async with Client(build_server(tool_settings(vllm_server))) as client:
        await chat(client, system=system, message="same")
        warm = await chat(client, system=system, message="same")
        reset = VllmResetOut.model_validate(await call_ok(client, "vllm_reset_prefix_cache", {}))
        cold = await chat(client, system=system, message="same")
    assert warm.trace is not None and cold.trace is not None
    assert (warm.trace.prefix_cache_hit_tokens or 0) > 0
    assert (reset.reachable, reset.reset, reset.dev_mode) == (True, True, True)
    assert cold.trace.prefix_cache_hit_tokens == 0


async def test_read_only_mode_keeps_chat_and_metrics_and_hides_lifecycle_tools(
    tmp_path: Path,
) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm",))
    async with Client(build_server(settings)) as client:
        every = {tool.name: tool for tool in (await client.list_tools()).tools}
    async with Client(build_server(settings.model_copy(update={"read_only": True}))) as client:
        visible = {tool.name for tool in (await client.list_tools()).tools}
    assert set(every) == visible | LIFECYCLE
    assert visible == {
        "vllm_chat",
        "vllm_metrics",
        "vllm_status",
        "vllm_logs",
        "vllm_trace_summary",
    }
    for name in LIFECYCLE:
        annotations = every[name].annotations
        assert annotations is not None and annotations.read_only_hint is False
    destructive = {name for name in LIFECYCLE if every[name].annotations.destructive_hint}  # type: ignore[union-attr]
    assert destructive == {"vllm_stop", "vllm_reset_prefix_cache", "vllm_restart_reuse"}


@MODES
async def test_a_vllm_that_is_down_reads_as_unreachable_with_a_reason(
    mode: str, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm",), vllm_base_url=url)
    async with Client(build_server(settings), mode=mode) as client:
        answer = VllmChatOut.model_validate(
            await call_ok(client, "vllm_chat", {"message": "hi", "model": "m"})
        )
        metrics = VllmMetricsOut.model_validate(await call_ok(client, "vllm_metrics", {}))
        reset = VllmResetOut.model_validate(await call_ok(client, "vllm_reset_prefix_cache", {}))
        status = VllmStatusOut.model_validate(await call_ok(client, "vllm_status", {}))
    assert (answer.reachable, answer.answer, answer.trace) == (False, None, None)
    assert answer.reason is not None and "not reachable" in answer.reason
    assert (metrics.reachable, metrics.snapshot) == (False, None)
    assert reset.reachable is False
    assert (status.running, status.reachable) == (False, False)
    assert status.reason is not None and "vllm_start" in status.reason


async def test_a_proxy_page_or_a_hung_vllm_reads_as_unreachable_with_what_happened(
    tmp_path: Path,
) -> None:
    """Every way vLLM fails to answer is reachable=false with its own reason, never a crash."""
    arguments = {"message": "hi", "model": "m"}
    reasons: list[str] = []
    for peer in (proxy_page_peer(), slow_peer(hold_s=30)):
        with peer as url:
            settings = Settings.build(
                data_dir=tmp_path, toolsets=("vllm",), vllm_base_url=url, vllm_timeout_s=0.5
            )
            async with Client(build_server(settings)) as client:
                out = VllmChatOut.model_validate(await call_ok(client, "vllm_chat", arguments))
        assert (out.reachable, out.answer) == (False, None) and out.reason is not None
        reasons.append(out.reason)
    assert "bad answer" in reasons[0]
    assert "did not answer within 0.5 s" in reasons[1]


async def test_vllm_chat_without_a_message_is_a_tool_error(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm",))
    async with Client(build_server(settings)) as client:
        message = await call_error(client, "vllm_chat", {"system": "only a system turn"})
        both = await call_error(
            client,
            "vllm_chat",
            {"message": "x", "messages": [{"role": "user", "content": "y"}]},
        )
    assert "message" in message
    assert "either" in both


async def test_vllm_trace_summary_reads_a_jsonl_file_and_lists_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    traces = [
        Trace(
            model="m",
            prompt_tokens=1000,
            completion_tokens=4,
            prefix_cache_hit_tokens=hit,
            prefix_cache_miss_tokens=1000 - hit,
            cached_tokens_source="usage",
            latency_s=0.05,
        )
        for hit in (0, 992)
    ]
    append_traces(path, traces[:1])
    with path.open("a") as handle:
        handle.write("{not a trace}\n")
    append_traces(path, traces[1:])
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm",), file_roots=(tmp_path,))
    async with Client(build_server(settings)) as client:
        out = VllmTraceSummaryOut.model_validate(
            await call_ok(client, "vllm_trace_summary", {"path": str(path)})
        )
        missing = await call_error(
            client, "vllm_trace_summary", {"path": str(tmp_path / "none.jsonl")}
        )
    assert (out.source, out.bad_lines, out.bad_line_count) == ("file", [2], 1)
    assert out.summary.calls == 2 and out.summary.total_tokens_saved == 992
    assert out.summary.estimated_compute_saved_s == pytest.approx(992 / (1000 / 0.05))
    assert "no trace file" in missing


@pytest.mark.vllm
async def test_vllm_start_of_a_bad_model_path_fails_with_vllms_reason_after_progress(
    vllm_private: VllmServers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm_private.stop_shared()  # one vLLM at a time, even a failing one
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    port = free_port()
    settings = Settings.build(
        data_dir=tmp_path,
        toolsets=("vllm",),
        vllm_python=VLLM_PYTHON,
        vllm_base_url=f"http://127.0.0.1:{port}/v1",
    )
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    bad_model = tmp_path / "no-such-model"
    arguments = {"model": str(bad_model), "max_model_len": 256, "kv_cache_memory_bytes": 2**26}
    async with Client(build_server(settings)) as client:
        result = await client.call_tool("vllm_start", arguments, progress_callback=on_progress)
    text = " ".join(getattr(block, "text", "") for block in result.content)
    assert result.is_error
    assert "vLLM exited" in text and str(bad_model) in text
    assert messages and messages[0].startswith("starting vLLM")
    assert ManagedVllm(tmp_path).running_state() is None
    assert not port_in_use("127.0.0.1", port)


async def test_vllm_logs_of_a_vllm_started_elsewhere_say_where_they_are_not_ours(
    tmp_path: Path,
) -> None:
    # Calls go to a vLLM on another address; this data dir runs none but kept an older log.
    own_log = ManagedVllm(tmp_path).log_path
    own_log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    own_log.write_text("a vLLM this data dir started long ago\n")
    url = f"http://127.0.0.2:{free_port()}/v1"
    settings = Settings.build(data_dir=tmp_path, vllm_base_url=url, toolsets=("vllm",))
    async with Client(build_server(settings)) as client:
        message = await call_error(client, "vllm_logs", {"lines": 20})
    assert f"not managed here: {url}" in message
    assert "not readable from here: read it on 127.0.0.2, where it runs" in message
    assert str(own_log) in message and "long ago" not in message
