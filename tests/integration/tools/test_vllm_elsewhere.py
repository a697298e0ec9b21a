"""vllm_status, vllm_metrics and fleet where pointed at a real vLLM this project did not start,
on 127.0.0.2 with a port that is free on 127.0.0.1: every answer is about that vLLM (and
vllm_logs says its log is on that host, not here).

Before targets, vllm_status took the configured URL's port and probed 127.0.0.1 there ("nothing
listens on port N"), which is the wrong machine's answer for a vLLM that runs elsewhere.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio
import pytest
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.processes.ports import port_in_use
from graph_kvcache_mcp.connectors.vllm.state import VllmStopResult
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.fleet.views import FleetWhereOut
from graph_kvcache_mcp.services.vllm.views import VllmChatOut, VllmMetricsOut, VllmStatusOut
from tests.support.mcp_calls import call_error, call_ok
from tests.support.vllm import BLOCK_SIZE, MODEL_NAME, VllmServers
from tests.support.vllm_elsewhere import ElsewhereVllm, vllm_elsewhere

pytestmark = pytest.mark.vllm


def prompt_text(words: int = 300) -> str:
    tag = uuid.uuid4().hex
    return f"Run {tag}. " + " ".join(f"item{i % 50} {tag[i % 32]}" for i in range(words))


def settings_for(remote: ElsewhereVllm, root: Path) -> Settings:
    fleet_file = root / "fleet.json"
    instance = {
        "name": "far",
        "base_url": remote.base_url,
        "kv_events": remote.kv_events,
        "kv_events_replay": remote.kv_events_replay,
    }
    fleet_file.write_text(json.dumps({"instances": [instance]}))
    return Settings.build(
        vllm_base_url=remote.base_url,
        vllm_model=MODEL_NAME,
        data_dir=root / "server",  # a data dir that never started a vLLM
        fleet_file=fleet_file,
        toolsets=("vllm", "fleet"),
    )


async def ask(settings: Settings, text: str) -> dict[str, object]:
    """Status, a chat call, metrics, fleet where for the same prompt, the same call again, a
    stop attempt and a log read: the answers by name."""
    messages = [{"role": "user", "content": text}]
    async with Client(build_server(settings)) as client:
        status = await call_ok(client, "vllm_status", {})
        first = await call_ok(client, "vllm_chat", {"messages": messages, "max_tokens": 1})
        metrics = await call_ok(client, "vllm_metrics", {})
        where = await call_ok(client, "fleet_where_cached", {"messages": messages})
        again = await call_ok(client, "vllm_chat", {"messages": messages, "max_tokens": 1})
        stop = await call_ok(client, "vllm_stop", {"wait_s": 1})
        logs = await call_error(client, "vllm_logs", {"lines": 20})
    return {
        "status": VllmStatusOut.model_validate(status),
        "first": VllmChatOut.model_validate(first),
        "metrics": VllmMetricsOut.model_validate(metrics),
        "where": FleetWhereOut.model_validate(where),
        "again": VllmChatOut.model_validate(again),
        "stop": VllmStopResult.model_validate(stop),
        "logs": logs,
    }


def test_status_metrics_and_fleet_where_answer_about_a_vllm_started_elsewhere(
    vllm_private: VllmServers, tmp_path: Path
) -> None:
    vllm_private.stop_shared()  # memory is shared: one vLLM at a time
    with vllm_elsewhere(tmp_path) as remote:
        assert not port_in_use("127.0.0.1", remote.port)  # a loopback probe would find nothing
        answers = anyio.run(ask, settings_for(remote, tmp_path), prompt_text())
        assert not port_in_use("127.0.0.1", remote.port)
    status = answers["status"]
    assert isinstance(status, VllmStatusOut)
    assert (status.running, status.reachable, status.managed_by_us) == (True, True, False)
    assert status.base_url == remote.base_url and status.port == remote.port
    assert status.served_models == [MODEL_NAME]
    assert status.reason is not None and remote.base_url in status.reason
    first, again = answers["first"], answers["again"]
    assert isinstance(first, VllmChatOut) and isinstance(again, VllmChatOut)
    assert first.trace is not None and again.trace is not None
    metrics = answers["metrics"]
    assert isinstance(metrics, VllmMetricsOut) and metrics.snapshot is not None
    assert metrics.metrics_url == f"http://{remote.host}:{remote.port}/metrics"
    assert (metrics.snapshot.prompt_tokens or 0) >= first.trace.prompt_tokens
    where = answers["where"]
    assert isinstance(where, FleetWhereOut)
    (far,) = where.instances
    assert far.reachable and far.block_size == BLOCK_SIZE
    assert far.prompt_tokens == first.trace.prompt_tokens
    hit = again.trace.prefix_cache_hit_tokens
    assert far.cached_tokens == hit and hit is not None and hit > 0  # what it then reported
    stop = answers["stop"]
    assert isinstance(stop, VllmStopResult)
    assert (stop.stopped, stop.how) == (False, "not_running")
    assert stop.reason is not None and f"not managed here: {remote.base_url}" in stop.reason
    logs = answers["logs"]
    assert isinstance(logs, str) and f"not managed here: {remote.base_url}" in logs
    assert f"read it on {remote.host}, where it runs" in logs
