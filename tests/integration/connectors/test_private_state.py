"""After real use, the data dir is private and child processes hold only the secrets they need."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.server import build_server
from tests.support.mcp_calls import call_error, call_ok
from tests.support.processes import SECRETS, environ_of, modes_under, wider_than_private


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """A common umask (022): private modes must not rely on a strict one."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def is_empty(directory: Path) -> bool:
    return not any(directory.iterdir())


@pytest.mark.usefixtures("permissive_umask")
async def test_after_real_use_everything_under_the_data_dir_is_0700_or_0600(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    settings = Settings.build(data_dir=data_dir, engine_backend="durable")
    with_engine = ManagedEngine(data_dir)
    try:
        async with Client(build_server(settings)) as client:
            await call_ok(client, "kv_put", {"key": "private:1", "value_b64": "aGVsbG8="})
            await call_ok(client, "kv_stats", {})
            modes = modes_under(data_dir)
    finally:
        with_engine.stop(term_wait_s=5.0)
    store_files = [name for name in modes if name.startswith("engine/store/")]
    assert store_files and "engine/engine.log" in modes and "engine/token" in modes
    assert any(name.startswith("engine/leases/") for name in modes)
    assert wider_than_private(modes, data_dir) == {}


def test_the_engine_gets_no_secret_but_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    managed = ManagedEngine(tmp_path)
    status = managed.start(backend="memory")
    try:
        assert status.pid is not None
        environ = environ_of(status.pid)
    finally:
        managed.stop(term_wait_s=5.0)
    assert not set(SECRETS.values()) & set(environ.values())
    assert environ["EPISTEMIC_GRAPH_KVCACHE_TOKEN"] == managed.token().get_secret_value()
    assert "PATH" in environ and "GRAPH_SERVICE_PERSIST_DIR" in environ


async def test_vllm_start_refuses_an_api_key_in_extra_args_before_starting_anything(
    tmp_path: Path,
) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=("vllm",))
    async with Client(build_server(settings)) as client:
        refused = await call_error(
            client,
            "vllm_start",
            {"model": "/nowhere", "port": free_port(), "extra_args": ["--api-key=sk-tool-9"]},
        )
    assert "VLLM_API_KEY" in refused and "sk-tool-9" not in refused
    assert is_empty(tmp_path)


def test_the_cli_refuses_an_api_key_in_extra_args_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["vllm", "start", "--model", "/nowhere", "--data-dir", str(tmp_path)]
    code = main([*argv, "--port", str(free_port()), "--extra-arg=--api-key", "--extra-arg=sk-9"])
    err = capsys.readouterr().err
    assert code == 2 and "VLLM_API_KEY" in err and "sk-9" not in err
    assert is_empty(tmp_path)
