"""Every tool path goes through the allowed roots and the bounded reader: paths outside the roots
(directly or through a symlink), devices, FIFOs and directories are refused at once, and a client's
declared roots are honoured where the session can ask for them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.types import ListRootsResult, Root

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.file_roots import ROOTS_ENV
from graph_kvcache_mcp.domain.vllm.traces import Trace
from graph_kvcache_mcp.server import build_server
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, call_error, call_ok, fresh_key

READERS: dict[str, Any] = {
    "kv_put": lambda path: {"key": fresh_key("roots"), "file_path": path},
    "vllm_trace_summary": lambda path: {"path": path},
    "lmcache_config": lambda path: {"hf_config": path},
}
WRITER = "kv_save"


def _settings(engine: RunningEngine, *roots: Path) -> Settings:
    return engine.settings.model_copy(
        update={"file_roots": roots, "toolsets": ("kv", "vllm", "lmcache")}
    )


def _trace_file(path: Path) -> Path:
    trace = Trace(
        model="m",
        prompt_tokens=10,
        completion_tokens=1,
        latency_s=0.01,
        cached_tokens_source="usage",
    )
    path.write_text(trace.model_dump_json() + "\n")
    return path


@MODES
async def test_every_path_tool_refuses_a_path_outside_the_roots_even_through_a_symlink(
    memory_engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    secret = _trace_file(outside / "secret.jsonl")
    (allowed / "link.jsonl").symlink_to(secret)
    (allowed / "linked-dir").symlink_to(outside)
    async with Client(build_server(_settings(memory_engine, allowed)), mode=mode) as client:
        for tool, arguments in READERS.items():
            for path in (secret, allowed / "link.jsonl", allowed / "linked-dir" / "secret.jsonl"):
                message = await call_error(client, tool, arguments(str(path)))
                assert "outside the allowed roots" in message and ROOTS_ENV in message
                assert str(allowed) in message
        for path in (outside / "new.bin", allowed / "linked-dir" / "new.bin"):
            message = await call_error(client, WRITER, {"key": "k", "path": str(path)})
            assert "outside the allowed roots" in message
    assert sorted(entry.name for entry in outside.iterdir()) == ["secret.jsonl"]


@MODES
async def test_devices_fifos_and_directories_are_refused_at_once(
    memory_engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    refusals = {"/dev/zero": "character device", str(fifo): "FIFO", str(tmp_path / "dir"): ""}
    settings = _settings(memory_engine, tmp_path, Path("/dev"))
    async with Client(build_server(settings), mode=mode) as client:
        for tool, arguments in READERS.items():
            for path, problem in refusals.items():
                with anyio.fail_after(10):  # a FIFO must not block the call
                    message = await call_error(client, tool, arguments(path))
                assert problem in message, (tool, path, message)
                if tool != "lmcache_config":  # for it, a directory is a model dir to look in
                    assert "not a regular file" in message or "directory" in message


@MODES
async def test_paths_inside_the_roots_work_and_kv_save_creates_a_private_new_file(
    memory_engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    value, key = os.urandom(3000), fresh_key("roots")
    (tmp_path / "v.bin").write_bytes(value)
    traces = _trace_file(tmp_path / "t.jsonl")
    async with Client(build_server(_settings(memory_engine, tmp_path)), mode=mode) as client:
        put = await call_ok(client, "kv_put", {"key": key, "file_path": str(tmp_path / "v.bin")})
        summary = await call_ok(client, "vllm_trace_summary", {"path": str(traces)})
        saved = await call_ok(client, "kv_save", {"key": key, "path": str(tmp_path / "out.bin")})
    assert put["state"] == "stored_new" and summary["summary"]["calls"] == 1
    assert saved["saved_to"] == str(tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == value
    assert (tmp_path / "out.bin").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "client_roots",
    ["none declared", "declared but empty"],  # the second is what the MCP Inspector sends
)
async def test_without_a_setting_or_client_roots_the_working_directory_is_the_root(
    memory_engine: RunningEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client_roots: str
) -> None:
    inside, outside = tmp_path / "cwd", tmp_path / "elsewhere.jsonl"
    inside.mkdir()
    _trace_file(inside / "t.jsonl")
    _trace_file(outside)
    monkeypatch.chdir(inside)
    settings = memory_engine.settings.model_copy(update={"toolsets": ("vllm",)})
    if client_roots == "none declared":
        client = Client(build_server(settings))
    else:
        roots = _roots_callback()
        client = Client(build_server(settings), mode="legacy", list_roots_callback=roots)
    async with client:
        await call_ok(client, "vllm_trace_summary", {"path": str(inside / "t.jsonl")})
        message = await call_error(client, "vllm_trace_summary", {"path": str(outside)})
    assert "the server's working directory" in message and str(inside) in message
    assert ("lists no local directory" in message) == (client_roots == "declared but empty")


def _roots_callback(*directories: Path) -> Any:
    async def list_roots(context: ClientRequestContext) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=d.as_uri(), name=d.name) for d in directories])

    return list_roots


async def test_a_legacy_client_s_declared_roots_are_the_rule(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    mine, other = tmp_path / "my project", tmp_path / "other"
    for directory in (mine, other):
        directory.mkdir()
        _trace_file(directory / "t.jsonl")
    settings = memory_engine.settings.model_copy(update={"toolsets": ("vllm",)})
    client = Client(
        build_server(settings), mode="legacy", list_roots_callback=_roots_callback(mine)
    )
    async with client:
        await call_ok(client, "vllm_trace_summary", {"path": str(mine / "t.jsonl")})
        message = await call_error(client, "vllm_trace_summary", {"path": str(other / "t.jsonl")})
    assert "the MCP client's roots" in message and str(mine) in message


async def test_the_setting_overrides_a_client_s_roots(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    mine, configured = tmp_path / "client", tmp_path / "configured"
    for directory in (mine, configured):
        directory.mkdir()
        _trace_file(directory / "t.jsonl")
    settings = memory_engine.settings.model_copy(
        update={"toolsets": ("vllm",), "file_roots": (configured,)}
    )
    client = Client(
        build_server(settings), mode="legacy", list_roots_callback=_roots_callback(mine)
    )
    async with client:
        await call_ok(client, "vllm_trace_summary", {"path": str(configured / "t.jsonl")})
        message = await call_error(client, "vllm_trace_summary", {"path": str(mine / "t.jsonl")})
    assert ROOTS_ENV in message and str(configured) in message


async def test_a_modern_session_cannot_ask_for_roots_and_uses_the_configured_rule(
    memory_engine: RunningEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "client"
    mine.mkdir()
    _trace_file(mine / "t.jsonl")
    monkeypatch.chdir(tmp_path / "client")
    settings = memory_engine.settings.model_copy(update={"toolsets": ("vllm",)})
    client = Client(build_server(settings), mode="auto", list_roots_callback=_roots_callback())
    async with client:
        # The client would allow nothing, but a 2026-07-28 session has no way to ask it.
        await call_ok(client, "vllm_trace_summary", {"path": str(mine / "t.jsonl")})


@pytest.mark.parametrize("where", ["/", "home"])
async def test_no_roots_and_a_working_directory_at_slash_or_home_refuse_every_file_tool(
    memory_engine: RunningEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """A host that starts the server from / (or ~) and declares no roots must not get a
    kv_put that reads /etc/...: the file tools refuse and say how to set the roots."""
    home = tmp_path / "home"
    home.mkdir()
    _trace_file(home / "t.jsonl")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir("/" if where == "/" else home)
    settings = memory_engine.settings.model_copy(update={"toolsets": ("kv", "vllm", "lmcache")})
    async with Client(build_server(settings)) as client:
        for tool, arguments in READERS.items():
            message = await call_error(client, tool, arguments(str(home / "t.jsonl")))
            assert "no file roots" in message and f"{ROOTS_ENV}=" in message, tool
        message = await call_error(client, WRITER, {"key": "k", "path": str(home / "new.bin")})
        assert "no file roots" in message
    assert not (home / "new.bin").exists()
    configured = settings.model_copy(update={"file_roots": (home,)})
    async with Client(build_server(configured)) as client:
        await call_ok(client, "vllm_trace_summary", {"path": str(home / "t.jsonl")})
