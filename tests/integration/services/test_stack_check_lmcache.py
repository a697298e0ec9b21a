"""diagnose stack with a real `lmcache server` (our native_plugin adapter on a real engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.services.diagnosis.stack_check import check_stack
from tests.support.engines import RunningEngine
from tests.support.lmcache import running_lmcache_server

pytestmark = pytest.mark.lmcache


async def test_a_healthy_lmcache_server_has_no_problem_and_reports_its_version(
    durable_engine: RunningEngine, tmp_path: Path
) -> None:
    vllm_url = f"http://127.0.0.1:{free_port()}/v1"
    settings = durable_engine.settings.model_copy(update={"vllm_base_url": vllm_url})
    with running_lmcache_server(durable_engine, tmp_path) as server:
        async with VllmClient(vllm_url, timeout_s=5.0, max_retries=0) as client:
            out = await check_stack(settings, client, lmcache_url=server.http_url)
    # The server was not started from the data dir: its environment and log are said unread.
    assert {f.id for f in out.findings} == {"vllm_unreachable", "versions", "runtime_not_readable"}
    versions = next(f for f in out.findings if f.id == "versions")
    assert versions.component == "lmcache" and "LMCache 0.5.6" in versions.evidence
    assert ("lmcache", True) in [(c.component, c.reachable) for c in out.checked]
