"""The instructions a model reads name only the tools this server registers, start it on a
read-only call, and say per toolset what reachable=false means."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.config import DEFAULT_TOOLSETS, Settings
from graph_kvcache_mcp.server import build_server

TOOL_NAME = re.compile(r"\b(?:kv|engine|bundle|vllm|lmcache|diagnose)_[a-z_]+[a-z]\b|graph_kvcache")
COMBINATIONS = [
    DEFAULT_TOOLSETS,
    ("kv",),
    ("diagnose",),
    ("vllm", "bundle"),
    (*DEFAULT_TOOLSETS, "lmcache"),
]


async def _instructions_and_tools(settings: Settings) -> tuple[str, dict[str, bool]]:
    server = build_server(settings)
    tools = await server.list_tools()
    read_only = {t.name: bool(t.annotations and t.annotations.read_only_hint) for t in tools}
    return server.instructions or "", read_only


@pytest.mark.parametrize("toolsets", COMBINATIONS, ids=",".join)
@pytest.mark.parametrize("read_only", [False, True])
def test_every_tool_the_instructions_name_is_registered(
    tmp_path: Path, toolsets: tuple[str, ...], read_only: bool
) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=toolsets, read_only=read_only)
    text, tools = anyio.run(_instructions_and_tools, settings)
    named = set(TOOL_NAME.findall(text))
    assert named
    if read_only:  # the read-only note covers the writers: they exist on a writable server
        assert "read-only" in text
        writable = settings.model_copy(update={"read_only": False})
        _, tools = anyio.run(_instructions_and_tools, writable)
    assert named <= set(tools), named - set(tools)


def test_the_first_call_suggested_is_read_only(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=DEFAULT_TOOLSETS)
    text, tools = anyio.run(_instructions_and_tools, settings)
    first = re.search(r"Start\s+with (\w+)", text)
    assert first is not None and tools[first.group(1)] is True


def test_reachable_false_is_worded_per_component(tmp_path: Path) -> None:
    text, _ = anyio.run(_instructions_and_tools, Settings.build(data_dir=tmp_path))
    assert "the store is down" not in text
    assert "the engine" in text and "vLLM" in text
    only_kv, _ = anyio.run(
        _instructions_and_tools, Settings.build(data_dir=tmp_path, toolsets=("kv",))
    )
    assert "vLLM" not in only_kv and "lmcache" not in only_kv.lower()
