"""The coordinator as part of the stack's lifecycle, every process real (a memory engine, `lmcache
server` and `lmcache coordinator` from .venv-lmcache): `--coordinator managed` starts it with the
server and `lmcache stop` (or the last session's exit) stops it after the server; a coordinator
named by URL is joined and never stopped; a failed start stops the coordinator it started."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus, LmcacheStopResult
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.stack.description import describe_stack
from tests.support.coordinator import running_coordinator
from tests.support.engines import RunningEngine
from tests.support.lmcache import cpu_server_flags, require_lmcache
from tests.support.mcp_calls import call_error, call_ok

pytestmark = pytest.mark.lmcache

MODEL = ["--model", "test-model", "--num-layers", "2", "--kv-heads", "2", "--head-dim", "64"]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    return code, captured.out


def _start_argv(data_dir: Path, *extra: str) -> list[str]:
    python = str(require_lmcache().parent / "python")
    return [
        "lmcache",
        "start",
        *MODEL,
        *("--lmcache-port", str(free_port()), "--lmcache-http-port", str(free_port())),
        *("--l1-size-gb", "0.1", "--python", python),
        *(f"--extra-arg={flag}" for flag in cpu_server_flags()),
        *("--data-dir", str(data_dir), "--json"),
        *extra,
    ]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/instances", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


@pytest.fixture
def engine_env(memory_engine: RunningEngine, monkeypatch: pytest.MonkeyPatch) -> RunningEngine:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", memory_engine.base_url)
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    monkeypatch.setenv("GRAPH_KVCACHE_LMCACHE_PYTHON", str(require_lmcache().parent / "python"))
    return memory_engine


def test_lmcache_start_with_a_managed_coordinator_and_lmcache_stop_stops_both(
    engine_env: RunningEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = ManagedCoordinator(tmp_path)
    try:
        _, out = _cli(capsys, *_start_argv(tmp_path, "--coordinator", "managed"))
        ours = coordinator.running_state()
        stack = describe_stack(tmp_path)
        _, status_out = _cli(capsys, "lmcache", "status", "--data-dir", str(tmp_path), "--json")
        _, stop_out = _cli(capsys, "lmcache", "stop", "--data-dir", str(tmp_path), "--json")
    finally:
        ManagedLmcache(tmp_path).stop()
        coordinator.stop()
    assert ours is not None
    assert LmcacheStatus.model_validate_json(out).coordinator_url == ours.url
    assert LmcacheStatus.model_validate_json(status_out).coordinator_url == ours.url
    assert stack.coordinator is not None
    assert (stack.coordinator.url, stack.coordinator.managed) == (ours.url, True)
    stopped = LmcacheStopResult.model_validate_json(stop_out)
    assert stopped.stopped
    assert stopped.also_stopped == [
        f"the managed lmcache coordinator pid {ours.process.pid} after it"
    ]
    assert coordinator.running_state() is None and not psutil.pid_exists(ours.process.pid)


def test_a_coordinator_named_by_url_is_joined_and_never_stopped(
    engine_env: RunningEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_coordinator(tmp_path) as url:
        try:
            _, out = _cli(capsys, *_start_argv(tmp_path, "--coordinator", url))
            stack = describe_stack(tmp_path)
            _, stop_out = _cli(capsys, "lmcache", "stop", "--data-dir", str(tmp_path), "--json")
        finally:
            ManagedLmcache(tmp_path).stop()
        still_answers = _answers(url)
    assert LmcacheStatus.model_validate_json(out).coordinator_url == url
    assert stack.coordinator is not None
    assert (stack.coordinator.url, stack.coordinator.managed, stack.coordinator.pid) == (
        url,
        False,
        None,
    )
    stopped = LmcacheStopResult.model_validate_json(stop_out)
    assert stopped.stopped and stopped.also_stopped == []
    assert still_answers


def test_a_failed_start_stops_the_coordinator_it_started(
    engine_env: RunningEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _start_argv(tmp_path, "--coordinator", "managed")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    http_port = argv.index("--lmcache-http-port") + 1
    argv[http_port] = str(taken.getsockname()[1])  # the server cannot bind its admin port
    try:
        code = main(argv)
    finally:
        taken.close()
        ManagedLmcache(tmp_path).stop()
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    coordinator = ManagedCoordinator(tmp_path)
    assert "graph-kvcache-mcp:" in coordinator.log_path.read_text()  # it was started first
    assert coordinator.running_state() is None


def _tool_settings(engine: RunningEngine, data_dir: Path, toolsets: tuple[str, ...]) -> Settings:
    return Settings.build(
        kv_url=engine.base_url,
        kv_token=engine.token,
        data_dir=data_dir,
        toolsets=toolsets,
        lmcache_python=require_lmcache().parent / "python",
    )


def _tool_args(**more: Any) -> dict[str, Any]:
    """`lmcache_start`'s arguments for what `MODEL` names, on free ports, as the CLI starts it."""
    flags = dict(zip(MODEL[::2], MODEL[1::2], strict=True))
    model = {
        flag.removeprefix("--").replace("-", "_"): int(value) if value.isdigit() else value
        for flag, value in flags.items()
    }
    ports = {"lmcache_port": free_port(), "lmcache_http_port": free_port()}
    return {**model, **ports, "l1_size_gb": 0.1, "extra_args": cpu_server_flags(), **more}


async def test_the_last_session_out_stops_the_server_and_its_managed_coordinator(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    settings = _tool_settings(memory_engine, tmp_path, ("lmcache",))
    coordinator = ManagedCoordinator(tmp_path)
    try:
        async with Client(build_server(settings)) as client:
            started = LmcacheStatus.model_validate(
                await call_ok(client, "lmcache_start", _tool_args(coordinator="managed"))
            )
            ours = coordinator.running_state()
        after = coordinator.running_state(), ManagedLmcache(tmp_path).running_state()
    finally:
        ManagedLmcache(tmp_path).stop()
        coordinator.stop()
    assert ours is not None and started.coordinator_url == ours.url
    assert after == (None, None)


async def test_vllm_start_refuses_a_coordinator_without_an_lmcache_server(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    settings = _tool_settings(memory_engine, tmp_path, ("vllm",))
    async with Client(build_server(settings)) as client:
        message = await call_error(
            client, "vllm_start", {"model": "m", "kv_connector": "none", "coordinator": "managed"}
        )
    assert "kv_connector mp_native" in message
    assert ManagedCoordinator(tmp_path).running_state() is None


def test_vllm_start_with_a_coordinator_but_no_lmcache_server_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["vllm", "start", "--model", "m", "--coordinator", "managed", "--data-dir", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2 and "use kv_connector mp_native" in err and "Traceback" not in err
    assert ManagedCoordinator(tmp_path).running_state() is None


def test_lmcache_stop_leaves_a_coordinator_started_as_a_service_running(
    engine_env: RunningEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = ManagedCoordinator(tmp_path)
    data_dir = ("--data-dir", str(tmp_path))
    try:
        _, service_out = _cli(capsys, "lmcache", "coordinator", "start", *data_dir, "--json")
        service = coordinator.running_state()
        _, out = _cli(capsys, *_start_argv(tmp_path, "--coordinator", "managed"))
        _, stop_out = _cli(capsys, "lmcache", "stop", *data_dir, "--json")
        after_server = coordinator.running_state()
        _, status_out = _cli(capsys, "lmcache", "coordinator", "status", *data_dir, "--json")
        _, end_out = _cli(capsys, "lmcache", "coordinator", "stop", *data_dir, "--json")
    finally:
        ManagedLmcache(tmp_path).stop()
        coordinator.stop()
    assert service is not None and service.runs_until_stop
    assert json.loads(service_out)["reachable"] is True
    assert LmcacheStatus.model_validate_json(out).coordinator_url == service.url  # joined it
    assert LmcacheStopResult.model_validate_json(stop_out).also_stopped == []
    assert after_server is not None and after_server.process.pid == service.process.pid
    assert json.loads(status_out)["url"] == service.url
    assert json.loads(end_out)["stopped"] is True
    assert not psutil.pid_exists(service.process.pid)


def test_coordinator_start_adopts_a_servers_coordinator_which_then_outlives_it(
    engine_env: RunningEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = ManagedCoordinator(tmp_path)
    data_dir = ("--data-dir", str(tmp_path))
    try:
        _cli(capsys, *_start_argv(tmp_path, "--coordinator", "managed"))
        joined = coordinator.running_state()
        _, adopted_out = _cli(capsys, "lmcache", "coordinator", "start", *data_dir, "--json")
        _, stop_out = _cli(capsys, "lmcache", "stop", *data_dir, "--json")
        after_server = coordinator.running_state()
    finally:
        ManagedLmcache(tmp_path).stop()
        coordinator.stop()
    assert joined is not None and not joined.runs_until_stop
    adopted = json.loads(adopted_out)
    assert (adopted["reused"], adopted["runs_until_stop"], adopted["pid"]) == (
        True,
        True,
        joined.process.pid,
    )
    assert LmcacheStopResult.model_validate_json(stop_out).also_stopped == []
    assert after_server is not None and after_server.process.pid == joined.process.pid
