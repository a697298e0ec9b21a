"""The managed engine's RESP wire, and the `redis_resp` lmcache server that may only start against
it once it answers (real engine, real `lmcache server`; no vLLM)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.readiness import resp_ping
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.processes.ports import free_port, port_in_use
from graph_kvcache_mcp.connectors.stack.resp import start_resp_lmcache
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.domain.diagnosis.stack_findings import StackDiagnosis
from graph_kvcache_mcp.domain.lmcache.config import LmcacheChoices, ProcessSpec, plan_lmcache
from graph_kvcache_mcp.errors import EngineProcessError, LmcacheProcessError
from graph_kvcache_mcp.services.diagnosis.stack_check import check_stack
from tests.support.engines import RunningEngine, running_engine
from tests.support.lmcache import TEST_MODEL, require_lmcache


@pytest.fixture(scope="module")
def resp_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with running_engine(tmp_path_factory.mktemp("engine-resp"), "durable", resp=True) as engine:
        yield engine


async def diagnose(data_dir: Path) -> StackDiagnosis:
    vllm_url = f"http://127.0.0.1:{free_port()}/v1"
    settings = Settings.build(data_dir=data_dir, vllm_base_url=vllm_url)
    async with VllmClient(vllm_url, timeout_s=5.0, max_retries=0) as client:
        return await check_stack(settings, client)


def resp_server_plan(*, port: int, http_port: int) -> ProcessSpec:
    """The generator's redis_resp server for a CPU vLLM, with a small L1."""
    plan = plan_lmcache(
        TEST_MODEL,
        LmcacheChoices(
            mode="redis_resp",
            lmcache_port=port,
            lmcache_http_port=http_port,
            l1_size_gb=0.1,
            cpu=True,
        ),
    )
    assert plan.lmcache_server is not None
    return plan.lmcache_server


def test_the_resp_wire_answers_its_derived_password_and_refuses_another(
    resp_engine: RunningEngine,
) -> None:
    credentials = resp_engine.managed.resp_credentials()
    assert credentials is not None
    status = resp_engine.managed.status()
    assert status.resp_address == f"127.0.0.1:{credentials.port}"
    assert (
        resp_ping(credentials.host, credentials.port, credentials.user, credentials.password)
        is None
    )
    wrong = resp_ping(credentials.host, credentials.port, credentials.user, SecretStr("x" * 64))
    assert wrong is not None and "WRONGPASS" in wrong.reason
    assert credentials.password.get_secret_value() not in repr(credentials)


def test_an_engine_without_the_wire_is_refused_rather_than_reused(tmp_path: Path) -> None:
    with running_engine(tmp_path, "memory") as engine:
        assert engine.managed.resp_credentials() is None
        assert engine.managed.status().resp_address is None
        with pytest.raises(EngineProcessError, match="without its RESP wire"):
            engine.managed.start(backend="memory", resp=True)


@pytest.mark.lmcache
def test_a_resp_server_is_refused_while_the_engine_is_down(tmp_path: Path) -> None:
    python = require_lmcache().with_name("python")
    port, http_port = free_port(), free_port()
    lmcache = ManagedLmcache(tmp_path, python=python)
    with running_engine(tmp_path, "memory", resp=True):
        pass  # started and stopped: its wire is gone
    with pytest.raises(LmcacheProcessError, match="RESP wire"):
        start_resp_lmcache(
            ManagedEngine(tmp_path),
            lmcache,
            resp_server_plan(port=port, http_port=http_port),
            env={},
            ready_timeout_s=60,
        )
    assert lmcache.running_state() is None
    assert not port_in_use("127.0.0.1", port) and not port_in_use("127.0.0.1", http_port)


@pytest.mark.lmcache
def test_a_resp_server_keeps_the_password_off_its_command_line_and_flags_an_engine_restart(
    tmp_path: Path,
) -> None:
    python = require_lmcache().with_name("python")
    lmcache = ManagedLmcache(tmp_path, python=python)
    server = resp_server_plan(port=free_port(), http_port=free_port())
    engine = ManagedEngine(tmp_path)
    engine.start(backend="durable", resp=True)
    try:
        credentials = engine.resp_credentials()
        assert credentials is not None
        status = start_resp_lmcache(engine, lmcache, server, env={}, ready_timeout_s=180)
        assert status.healthy and status.resp_peer_gone is None
        assert status.report is not None and status.report.l2_adapters
        assert all(adapter.healthy for adapter in status.report.l2_adapters)
        secret = credentials.password.get_secret_value()
        assert status.pid is not None
        cmdline = Path(f"/proc/{status.pid}/cmdline").read_bytes().decode(errors="replace")
        assert f'"port":{credentials.port}' in cmdline and secret not in cmdline
        # nor in its environment (which LMCache's admin API could show): a private file's path
        environ = Path(f"/proc/{status.pid}/environ").read_bytes().decode(errors="replace")
        assert secret not in environ and "LMCACHE_RESP_PASSWORD_FILE=" in environ
        assert secret not in (tmp_path / "lmcache" / "state.json").read_text()
        assert secret not in lmcache.log_path.read_text(errors="replace")
        assert secret not in status.model_dump_json()

        engine.stop(term_wait_s=5.0)
        engine.start(backend="durable", resp=True)  # a new process: the adapter never reconnects
        flagged = lmcache.status()
        assert flagged.resp_peer_gone is not None and "restart the lmcache server" in (
            flagged.resp_peer_gone
        )
        with pytest.raises(LmcacheProcessError, match="gone"):
            start_resp_lmcache(engine, lmcache, server, env={}, ready_timeout_s=60)
        # diagnose_stack finds the managed server by itself and says what to do
        diagnosis = anyio.run(diagnose, tmp_path)
        found = {f.id: f for f in diagnosis.findings}
        assert "restart the lmcache server" in found["lmcache_resp_engine_restarted"].fix
        assert ("lmcache", True) in [(c.component, c.reachable) for c in diagnosis.checked]
        assert json.loads((tmp_path / "lmcache" / "state.json").read_text())["resp_peer"]
    finally:
        lmcache.stop(term_wait_s=15.0)
        engine.stop(term_wait_s=5.0)
