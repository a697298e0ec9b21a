"""What the processes the project starts for a user expose to another local user (`nobody`),
staged for real: a managed `lmcache server` (from .venv-lmcache) with our engine adapter as L2."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus
from graph_kvcache_mcp.connectors.processes.ports import free_port
from tests.integration.connectors.test_lmcache_server import REQUESTS, bench_server
from tests.support.engines import RunningEngine, require_in_ci
from tests.support.lmcache import cpu_server_flags, require_lmcache
from tests.support.neighbour import as_nobody, as_owner, can_run_as_nobody

pytestmark = pytest.mark.lmcache


def _start_args(data_dir: Path) -> list[str]:
    """`lmcache start` of a small CPU server in `data_dir`."""
    python = str(require_lmcache().parent / "python")
    return [
        "lmcache",
        "start",
        *("--model", "test-model", "--num-layers", "2", "--kv-heads", "2"),
        *("--head-dim", "64", "--l1-size-gb", "0.1", "--python", python),
        *("--lmcache-port", str(free_port()), "--lmcache-http-port", str(free_port())),
        *(f"--extra-arg={flag}" for flag in cpu_server_flags()),
        *("--data-dir", str(data_dir)),
    ]


@contextmanager
def lmcache_started(
    engine: RunningEngine, data_dir: Path, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> Iterator[ManagedLmcache]:
    """The managed server as `lmcache start` (with `extra` flags) starts it in `data_dir`, the
    engine token handed over, for a neighbour (`nobody`) to probe; stopped on exit."""
    if not can_run_as_nobody():
        require_in_ci("root with setpriv and /usr/bin/python3 (a second local user)")
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", engine.base_url)
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", engine.token.get_secret_value())
    managed = ManagedLmcache(data_dir)
    try:
        assert main([*_start_args(data_dir), *extra]) == 0
        yield managed
    finally:
        managed.stop()


@pytest.fixture
def started_server(
    memory_engine: RunningEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LmcacheStatus, ManagedLmcache]]:
    """The managed server as `lmcache start` starts it, the engine token handed over."""
    with lmcache_started(memory_engine, tmp_path, monkeypatch) as managed:
        yield managed.status(), managed


def test_a_neighbour_reads_no_engine_token_from_the_lmcache_servers_admin_api(
    started_server: tuple[LmcacheStatus, ManagedLmcache], memory_engine: RunningEngine
) -> None:
    status, managed = started_server
    token = memory_engine.token.get_secret_value()
    assert status.http_url is not None and status.pid is not None

    env = as_nobody("http", "GET", status.http_url + "/env")
    health = as_owner("http", "GET", status.http_url + "/healthcheck")
    refused = [
        as_nobody("http", "GET", status.http_url + path)["status"]
        for path in ("/healthcheck", "/config", "/metrics", "/status")
    ]
    environ = Path(f"/proc/{status.pid}/environ").read_bytes().decode(errors="replace")

    assert env["status"] == 404 and token not in env["body"], env
    assert health["status"] == 200  # what we read ourselves still answers
    assert refused == [404] * 4  # ... and to no one else
    # Not in its environment at all, only the private file's path, which nobody cannot open.
    assert token not in environ
    token_file = managed.home / "epistemic_graph_kvcache_token"
    assert f"EPISTEMIC_GRAPH_KVCACHE_TOKEN_FILE={token_file}" in environ
    assert token_file.stat().st_mode & 0o777 == 0o600 and managed.home.stat().st_mode & 0o077 == 0
    # ... and the adapter inside the server found the token there: it reached the engine.
    # An HTTP 401 as its own number: ports, pids and timestamps (",401" ms) hold "401" too.
    assert not re.search(r"(?<![\d,.:])401(?!\d)", managed.log_path.read_text(errors="replace"))
    # No copy of the token outlives the server.
    managed.stop()
    assert not token_file.exists()


def test_a_neighbour_cannot_change_the_lmcache_servers_state_over_its_admin_api(
    started_server: tuple[LmcacheStatus, ManagedLmcache],
) -> None:
    status, _ = started_server
    assert status.http_url is not None
    attempts = {
        path: as_nobody("http", method, status.http_url + path)["status"]
        for method, path in (
            ("POST", "/cache/clear"),
            ("DELETE", "/cache/objects"),
            ("POST", "/metrics/reset"),
            ("POST", "/run_script"),
            ("GET", "/threads"),
            ("GET", "/loglevel"),
        )
    }
    assert all(code in (404, 405) for code in attempts.values()), attempts


def test_a_neighbour_cannot_connect_to_the_lmcache_servers_kv_rpc(
    started_server: tuple[LmcacheStatus, ManagedLmcache], memory_engine: RunningEngine
) -> None:
    status, managed = started_server
    state = managed.running_state()
    assert state is not None and status.rpc_url is not None

    socket_knock = as_nobody("connect", status.rpc_url)
    port_knock = as_nobody("connect", f"tcp://127.0.0.1:{state.port}")
    assert status.http_url is not None
    # The owner's LMCache client (the one vLLM's connector uses) stores and reloads over it.
    bench = bench_server(status.rpc_url, status.http_url, memory_engine, first=2000)

    # LMCache's MP protocol has no authentication: only a socket nobody can open keeps a
    # neighbour from looking up, storing and retrieving chunks as a vLLM would.
    assert status.rpc_url == f"ipc://{managed.home}/rpc-{state.port}.sock"
    assert not socket_knock["connected"] and "Permission denied" in socket_knock["error"]
    assert not port_knock["connected"], "the KV RPC still listens on its TCP port"
    assert bench.count("CHECKSUM MATCH OK") == REQUESTS, bench[-2000:]
    managed.stop()
    assert not (managed.home / f"rpc-{state.port}.sock").exists()  # a stop leaves no socket


def test_a_data_dir_too_long_for_the_rpc_socket_gets_no_tcp_kv_rpc(
    memory_engine: RunningEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", memory_engine.base_url)
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    long_dir = tmp_path / ("d" * 100)
    assert main(_start_args(long_dir)) != 0
    assert "too long for the lmcache server's private KV RPC socket" in capsys.readouterr().err
    assert ManagedLmcache(long_dir).running_state() is None  # refused before anything started
