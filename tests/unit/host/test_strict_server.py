"""What a model sees when it calls a tool wrongly: strict schemas, one error text, -32602 codes.

No engine is needed: every call here is refused before any I/O (the KV URL points at a closed
port so a call that got through would say unreachable, not pass).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from mcp import Client, MCPError
from mcp.types import INVALID_PARAMS

from graph_kvcache_mcp.config import TOOLSETS, Settings
from graph_kvcache_mcp.host.tool_schemas import lean_schema
from graph_kvcache_mcp.server import build_server
from tests.support.mcp_calls import MODES, call_error, call_ok
from tests.support.surfaces import tools_of

PYDANTIC_BOILERPLATE = ("errors.pydantic.dev", "validation error for", "Arguments", "[type=")


def _settings(tmp_path: Path, *, read_only: bool = False) -> Settings:
    return Settings.build(
        data_dir=tmp_path, kv_url="http://127.0.0.1:9", read_only=read_only, toolsets=TOOLSETS
    )


def _schemas_with_a_title(schema: Any, path: str = "") -> list[str]:
    """Paths of every schema object under `schema` that carries a `title` keyword."""
    found: list[str] = []
    if isinstance(schema, dict):
        if isinstance(schema.get("title"), str):
            found.append(path or "/")
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                for name, sub in value.items():
                    found += _schemas_with_a_title(sub, f"{path}/properties/{name}")
            elif key not in ("default", "examples", "const", "enum"):
                found += _schemas_with_a_title(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for index, sub in enumerate(schema):
            found += _schemas_with_a_title(sub, f"{path}/{index}")
    return found


@pytest.mark.parametrize("read_only", [False, True], ids=["default", "read-only"])
async def test_every_input_schema_is_closed_and_has_no_titles(
    read_only: bool, tmp_path: Path
) -> None:
    tools = await tools_of(_settings(tmp_path, read_only=read_only))
    assert tools
    for tool in tools:
        schema = tool["inputSchema"]
        assert schema.get("additionalProperties") is False, tool["name"]
        assert _schemas_with_a_title(schema) == [], tool["name"]


async def test_every_input_schema_is_valid_json_schema(tmp_path: Path) -> None:
    for tool in await tools_of(_settings(tmp_path)):
        Draft202012Validator.check_schema(tool["inputSchema"])


async def test_the_lean_bundle_compile_schema_accepts_a_full_call_and_refuses_stray_fields(
    tmp_path: Path,
) -> None:
    """Inlined definitions, dropped null branches and closed objects, checked by a validator a
    host would use."""
    (tool,) = [t for t in await tools_of(_settings(tmp_path)) if t["name"] == "bundle_compile"]
    item = {
        "id": "a",
        "text": "t",
        "source_refs": ["doc"],
        "relevance": 0.5,
        "relations": [{"type": "supports", "target": "b"}],
    }
    call = {"query": "q", "items": [item], "weights": {"relevance": 1}, "token_budget": 10}
    validator = Draft202012Validator(tool["inputSchema"])
    assert list(validator.iter_errors(call)) == []
    stray = {**call, "items": [{**item, "score": 1}]}
    assert [e.validator for e in validator.iter_errors(stray)] == ["additionalProperties"]


@MODES
async def test_an_explicit_null_for_an_optional_argument_is_still_accepted(
    mode: str, tmp_path: Path
) -> None:
    async with Client(build_server(_settings(tmp_path)), mode=mode) as client:
        out = await call_ok(client, "kv_stats", {"since": None})
    assert out["reachable"] is False  # the call ran (the KV URL is a closed port)


def test_lean_schema_drops_titles_but_keeps_a_property_that_is_named_title() -> None:
    schema = {
        "title": "Args",
        "type": "object",
        "properties": {"title": {"title": "Title", "type": "string"}},
        "$defs": {"Item": {"title": "Item", "anyOf": [{"title": "X", "type": "string"}]}},
    }
    assert lean_schema(schema) == {
        "type": "object",
        "properties": {"title": {"type": "string"}},
        "$defs": {"Item": {"anyOf": [{"type": "string"}]}},
    }


def test_lean_schema_writes_a_definition_used_once_in_place_and_keeps_shared_ones() -> None:
    schema = {
        "$defs": {
            "Once": {"type": "object", "properties": {"s": {"$ref": "#/$defs/Shared"}}},
            "Shared": {"type": "string", "description": "class docstring"},
        },
        "properties": {
            "a": {"$ref": "#/$defs/Once", "description": "a"},
            "b": {"$ref": "#/$defs/Shared"},
        },
    }
    assert lean_schema(schema) == {
        "properties": {
            "a": {
                "type": "object",
                "properties": {"s": {"$ref": "#/$defs/Shared"}},
                "description": "a",
            },
            "b": {"$ref": "#/$defs/Shared"},
        },
        "$defs": {"Shared": {"type": "string"}},
    }


def test_lean_schema_shows_a_null_default_as_the_plain_type_and_keeps_required_nulls() -> None:
    optional = {
        "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
        "default": None,
        "description": "d",
    }
    required_nullable = {"anyOf": [{"type": "integer"}, {"type": "null"}], "description": "r"}
    schema = {"properties": {"n": optional, "r": required_nullable}, "required": ["r"]}
    assert lean_schema(schema) == {
        "properties": {
            "n": {"type": "integer", "minimum": 1, "description": "d"},
            "r": required_nullable,
        },
        "required": ["r"],
    }


@MODES
async def test_an_unknown_argument_is_refused_by_name_with_the_valid_ones_listed(
    mode: str, tmp_path: Path
) -> None:
    async with Client(build_server(_settings(tmp_path)), mode=mode) as client:
        message = await call_error(client, "kv_get", {"keys": ["a"], "include_values": True})
    assert message == (
        "Error executing tool kv_get: invalid arguments: include_values: unknown argument "
        "(valid: keys, include_value, max_inline_bytes). Fix them and call kv_get again."
    )


@MODES
async def test_a_bad_or_missing_argument_is_named_without_pydantic_boilerplate(
    mode: str, tmp_path: Path
) -> None:
    async with Client(build_server(_settings(tmp_path)), mode=mode) as client:
        message = await call_error(client, "kv_get", {"max_inline_bytes": -1})
    assert message == (
        "Error executing tool kv_get: invalid arguments: keys: required argument missing; "
        "max_inline_bytes: should be greater than or equal to 0. Fix them and call kv_get again."
    )
    assert not any(noise in message for noise in PYDANTIC_BOILERPLATE)


@MODES
async def test_a_nested_argument_error_names_its_path(mode: str, tmp_path: Path) -> None:
    async with Client(build_server(_settings(tmp_path)), mode=mode) as client:
        message = await call_error(
            client, "vllm_chat", {"messages": [{"role": "robot", "content": "hi"}]}
        )
    assert "messages.0.role: should be 'system', 'user' or 'assistant'" in message
    assert not any(noise in message for noise in PYDANTIC_BOILERPLATE)


@MODES
async def test_graph_kvcache_put_on_a_read_only_server_says_the_server_is_read_only(
    mode: str, tmp_path: Path
) -> None:
    async with Client(build_server(_settings(tmp_path, read_only=True)), mode=mode) as client:
        message = await call_error(client, "graph_kvcache", {"action": "put", "key": "k"})
    assert message == (
        "Error executing tool graph_kvcache: invalid arguments: action: this server is read-only "
        "(GRAPH_KVCACHE_READ_ONLY / --read-only): put is not available. "
        "Fix them and call graph_kvcache again."
    )


@MODES
async def test_a_writer_withheld_by_read_only_mode_answers_32602_saying_so(
    mode: str, tmp_path: Path
) -> None:
    async with Client(build_server(_settings(tmp_path, read_only=True)), mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("kv_put", {"key": "k", "value_b64": "AA=="})
    assert refused.value.error.code == INVALID_PARAMS
    assert refused.value.error.message == (
        "this server is read-only (GRAPH_KVCACHE_READ_ONLY / --read-only): kv_put is not available"
    )


@MODES
async def test_an_unknown_tool_answers_32602_listing_the_tools_and_logs_no_traceback(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with Client(build_server(_settings(tmp_path)), mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("kv_gett", {})
    assert refused.value.error.code == INVALID_PARAMS
    assert refused.value.error.message.startswith("unknown tool 'kv_gett'; this server has: ")
    assert "kv_get, " in refused.value.error.message
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING] == []


@MODES
async def test_an_unknown_prompt_answers_32602_and_logs_no_traceback(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with Client(build_server(_settings(tmp_path)), mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.get_prompt("diagnose", {})
        known = await client.get_prompt("diagnose_kv_cache", {})
    assert refused.value.error.code == INVALID_PARAMS
    assert refused.value.error.message == (
        "unknown prompt 'diagnose'; this server has: diagnose_kv_cache"
    )
    assert known.messages
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING] == []


@MODES
async def test_an_unknown_prompt_argument_answers_32602_naming_it(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with Client(build_server(_settings(tmp_path)), mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.get_prompt("diagnose_kv_cache", {"symptoms": "slow"})
    assert refused.value.error.code == INVALID_PARAMS
    assert refused.value.error.message == (
        "invalid arguments for prompt diagnose_kv_cache: symptoms: unknown argument "
        "(valid: symptom)"
    )
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING] == []


def test_clip_arguments_quotes_each_long_argument_briefly_with_its_length() -> None:
    from graph_kvcache_mcp.errors import QUOTE_LIMIT
    from graph_kvcache_mcp.host.strict_server import clip_arguments

    long = "y" * 5000
    message = f"path {long!r} is outside; also {long}; short 'ok' stays"
    clipped = clip_arguments(message, {"path": long, "other": ["ok"], "nested": {"a": long}})
    assert "(5000 characters)" in clipped and "'ok'" in clipped
    assert len(clipped) < 3 * QUOTE_LIMIT
    assert clip_arguments("untouched", {"path": long}) == "untouched"
