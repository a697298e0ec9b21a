"""`lmcache start|status|stop` and the lmcache_* lifecycle tools against a real `lmcache server`
(from .venv-lmcache) whose L2 adapter is our client on a real engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus, LmcacheStopResult
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.server import build_server
from tests.support.engines import RunningEngine
from tests.support.lmcache import cpu_server_flags, require_lmcache

pytestmark = pytest.mark.lmcache

MODEL = ["--model", "test-model", "--num-layers", "2", "--kv-heads", "2", "--head-dim", "64"]


def _cpu_server_args() -> list[str]:
    return [f"--extra-arg={arg}" for arg in cpu_server_flags()]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_lmcache_start_status_stop_runs_the_planned_server_and_reports_its_adapter(
    memory_engine: RunningEngine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", memory_engine.base_url)
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    python = str(require_lmcache().parent / "python")
    ports = ["--lmcache-port", str(free_port()), "--lmcache-http-port", str(free_port())]
    common = ["--data-dir", str(tmp_path), "--json"]
    start = ["lmcache", "start", *MODEL, *ports, "--l1-size-gb", "0.1", "--python", python]
    code1, out1, err1 = _run(capsys, *start, *_cpu_server_args(), *common)
    code2, out2, _ = _run(capsys, *start, *_cpu_server_args(), *common)
    code3, out3, _ = _run(capsys, "lmcache", "status", *common)
    code4, out4, _ = _run(capsys, "lmcache", "stop", *common)
    code5, out5, _ = _run(capsys, "lmcache", "status", *common)
    assert code1 == 0, err1
    started, again = (
        LmcacheStatus.model_validate_json(out1),
        LmcacheStatus.model_validate_json(out2),
    )
    status = LmcacheStatus.model_validate_json(out3)
    assert (started.healthy, started.managed_by_us, started.reused) == (True, True, False)
    assert (code2, again.reused, again.pid) == (0, True, started.pid)
    assert code3 == 0 and status.report is not None
    assert status.report.healthy is True
    assert [adapter.healthy for adapter in status.report.l2_adapters] == [True]
    assert status.report.l1_total_bytes and status.report.l1_total_bytes > 0
    assert memory_engine.token.get_secret_value() not in out1 + out3
    assert (code4, LmcacheStopResult.model_validate_json(out4).how) == (0, "terminated")
    assert (code5, json.loads(out5)["running"]) == (3, False)


def test_lmcache_start_refuses_the_in_process_mode_which_has_no_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        capsys,
        "lmcache",
        "start",
        *MODEL,
        "--mode",
        "inprocess_plugin",
        "--data-dir",
        str(tmp_path),
    )
    assert code == 2 and "no lmcache server" in err


async def test_the_lmcache_tools_start_report_and_stop_the_server(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    settings = Settings.build(
        kv_url=memory_engine.base_url,
        kv_token=memory_engine.token,
        data_dir=tmp_path,
        toolsets=("lmcache",),
        lmcache_python=require_lmcache().parent / "python",
    )
    async with Client(build_server(settings)) as client:
        before = await client.call_tool("lmcache_status", {})
        started = await client.call_tool(
            "lmcache_start",
            {
                "model": "test-model",
                "num_layers": 2,
                "kv_heads": 2,
                "head_dim": 64,
                "lmcache_port": free_port(),
                "lmcache_http_port": free_port(),
                "l1_size_gb": 0.1,
                "extra_args": cpu_server_flags(),
            },
        )
        stopped = await client.call_tool("lmcache_stop", {})
    assert LmcacheStatus.model_validate(before.structured_content).running is False
    status = LmcacheStatus.model_validate(started.structured_content)
    assert status.healthy and status.report is not None and status.report.l2_adapters
    assert LmcacheStopResult.model_validate(stopped.structured_content).stopped
