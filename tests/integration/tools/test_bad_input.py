"""Bad input is refused as a tool error naming the problem, and nothing reaches the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from graph_kvcache_mcp.domain.engine.limits import (
    DURABLE_MAX_KEY_BYTES,
    LONGEST_KEY_BYTES,
    MAX_VALUE_BYTES,
)
from graph_kvcache_mcp.domain.outcomes import Presence
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.tools.kv_input import MAX_B64_CHARS
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, b64, call_error, fresh_key, write_counters

INVALID_KEYS = [
    pytest.param("", "empty", id="empty"),
    pytest.param("blk one", "charset", id="space"),
    pytest.param("blk?1", "charset", id="question-mark"),
    pytest.param("blk#1", "charset", id="hash"),
    pytest.param("blk\u00e9", "charset", id="non-ascii"),
    pytest.param("blk\n1", "charset", id="control"),
    pytest.param("k" * (LONGEST_KEY_BYTES + 1), "length", id="too-long"),
    pytest.param("stats", "reserved", id="reserved-name"),
    pytest.param("version/1", "reserved", id="reserved-prefix"),
    pytest.param("blk/exists", "exists-suffix", id="exists-suffix"),
]

BAD_BASE64 = [
    pytest.param("aGVsbG8", "not valid standard base64", id="missing-padding"),
    pytest.param("aGVs bG8=", "not valid standard base64", id="space"),
    pytest.param("aGVs\nbG8=", "not valid standard base64", id="line-break"),
    pytest.param("aGVsbG8*", "not valid standard base64", id="stray-character"),
    pytest.param("-_-_", "URL-safe", id="url-safe"),
]


async def test_a_key_over_the_durable_backends_limit_is_a_tool_error_naming_the_backend(
    durable_engine: RunningEngine,
) -> None:
    """Valid on the memory backend, too long for the durable one (which answered 500): every KV
    tool refuses it as bad input, and nothing reaches the store."""
    key = fresh_key("long") + "k" * DURABLE_MAX_KEY_BYTES
    before = write_counters(durable_engine.sync_client())
    calls: list[tuple[str, dict[str, Any]]] = [
        ("kv_put", {"key": key, "value_b64": b64(b"value")}),
        ("kv_get", {"keys": [key]}),
        ("kv_exists", {"keys": ["fine:key", key]}),
        ("graph_kvcache", {"action": "put", "key": key, "value_b64": b64(b"value")}),
    ]
    async with Client(build_server(durable_engine.settings)) as client:
        messages = [await call_error(client, tool, arguments) for tool, arguments in calls]
    for (tool, _), message in zip(calls, messages, strict=True):
        assert "rule: length" in message and "durable backend" in message, message
        assert f"call {tool} again" in message
    assert write_counters(durable_engine.sync_client()) == before


@MODES
@pytest.mark.parametrize(("key", "rule"), INVALID_KEYS)
async def test_invalid_keys_are_refused_by_every_kv_tool_and_nothing_is_stored(
    memory_engine: RunningEngine, mode: str, key: str, rule: str
) -> None:
    before = write_counters(memory_engine.sync_client())
    calls: list[tuple[str, dict[str, Any]]] = [
        ("kv_put", {"key": key, "value_b64": b64(b"value")}),
        ("kv_get", {"keys": ["fine:key", key]}),
        ("kv_exists", {"keys": [key]}),
        ("graph_kvcache", {"action": "put", "key": key, "value_b64": b64(b"value")}),
        ("graph_kvcache", {"action": "get", "key": key}),
    ]
    async with Client(build_server(memory_engine.settings), mode=mode) as client:
        messages = [await call_error(client, tool, arguments) for tool, arguments in calls]
    for message in messages:
        assert f"rule: {rule}" in message, message
    assert write_counters(memory_engine.sync_client()) == before


@MODES
@pytest.mark.parametrize(("text", "problem"), BAD_BASE64)
async def test_bad_base64_is_refused_and_the_key_stays_absent(
    engine: RunningEngine, mode: str, text: str, problem: str
) -> None:
    key = fresh_key("bad-b64")
    async with Client(build_server(engine.settings), mode=mode) as client:
        direct = await call_error(client, "kv_put", {"key": key, "value_b64": text})
        compat = await call_error(
            client, "graph_kvcache", {"action": "put", "key": key, "value_b64": text}
        )
    assert problem in direct and problem in compat
    assert engine.sync_client().contains(key) == Presence(False)


async def test_oversized_base64_is_refused_before_decoding(memory_engine: RunningEngine) -> None:
    key = fresh_key("huge")
    text = "A" * (MAX_B64_CHARS + 4)
    async with Client(build_server(memory_engine.settings)) as client:
        direct = await call_error(client, "kv_put", {"key": key, "value_b64": text})
        compat = await call_error(
            client, "graph_kvcache", {"action": "put", "key": key, "value_b64": text}
        )
    for message in (direct, compat):
        assert "largest value the engine stores" in message
    assert memory_engine.sync_client().contains(key) == Presence(False)


@MODES
async def test_an_oversized_file_is_refused_without_reading_it(
    memory_engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    key, big = fresh_key("huge-file"), tmp_path / "big.bin"
    with big.open("wb") as handle:  # sparse: no disk space used
        handle.truncate(MAX_VALUE_BYTES + 1)
    settings = memory_engine.settings.model_copy(update={"file_roots": (tmp_path,)})
    async with Client(build_server(settings), mode=mode) as client:
        message = await call_error(client, "kv_put", {"key": key, "file_path": str(big)})
    assert f"{MAX_VALUE_BYTES + 1:,} bytes" in message and "at most" in message
    assert memory_engine.sync_client().contains(key) == Presence(False)


@MODES
async def test_kv_put_needs_exactly_one_source_of_bytes(
    memory_engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    key, source = fresh_key(), tmp_path / "v.bin"
    source.write_bytes(b"v")
    settings = memory_engine.settings.model_copy(update={"file_roots": (tmp_path,)})
    async with Client(build_server(settings), mode=mode) as client:
        neither = await call_error(client, "kv_put", {"key": key})
        both = await call_error(
            client, "kv_put", {"key": key, "value_b64": b64(b"v"), "file_path": str(source)}
        )
        relative = await call_error(client, "kv_put", {"key": key, "file_path": "v.bin"})
        missing = await call_error(
            client, "kv_put", {"key": key, "file_path": str(tmp_path / "absent")}
        )
    assert "exactly one of value_b64" in neither and "exactly one of value_b64" in both
    assert "relative" in relative and "does not exist" in missing
    assert memory_engine.sync_client().contains(key) == Presence(False)


@MODES
async def test_graph_kvcache_refuses_an_unknown_action_and_missing_arguments(
    memory_engine: RunningEngine, mode: str
) -> None:
    before = write_counters(memory_engine.sync_client())
    async with Client(build_server(memory_engine.settings), mode=mode) as client:
        unknown = await call_error(client, "graph_kvcache", {"action": "delete", "key": "k"})
        no_key = await call_error(client, "graph_kvcache", {"action": "get"})
        no_value = await call_error(client, "graph_kvcache", {"action": "put", "key": "k"})
    assert "action" in unknown and "'get', 'put', 'contains', 'exists' or 'stats'" in unknown
    assert "action=get needs a key" in no_key
    assert "action=put needs value_b64" in no_value
    assert write_counters(memory_engine.sync_client()) == before


@MODES
async def test_kv_get_refuses_an_empty_key_list_and_too_large_an_inline_cap(
    memory_engine: RunningEngine, mode: str
) -> None:
    async with Client(build_server(memory_engine.settings), mode=mode) as client:
        empty = await call_error(client, "kv_get", {"keys": []})
        cap = await call_error(client, "kv_get", {"keys": ["k"], "max_inline_bytes": 10**9})
    assert "keys" in empty and "at least 1" in empty
    assert "max_inline_bytes" in cap


async def test_a_nul_byte_in_any_path_argument_is_a_tool_error_naming_it(
    memory_engine: RunningEngine, tmp_path: Path
) -> None:
    key = fresh_key("nul")
    settings = memory_engine.settings.model_copy(update={"file_roots": (tmp_path,)})
    bad = f"{tmp_path}/a\0b"
    calls = [
        ("kv_put", {"key": key, "file_path": bad}),
        ("kv_save", {"key": key, "path": bad}),
        ("diagnose_budget", {"hf_config": bad}),
        ("vllm_trace_summary", {"path": bad}),
    ]
    async with Client(build_server(settings)) as client:
        messages = [await call_error(client, tool, arguments) for tool, arguments in calls]
    for (tool, _), message in zip(calls, messages, strict=True):
        assert "NUL byte" in message, (tool, message)
    assert memory_engine.sync_client().contains(key) == Presence(False)


BROKEN_CONFIGS = [
    pytest.param({"num_attention_heads": -4}, "num_attention_heads", id="negative-heads"),
    pytest.param({"num_attention_heads": 0}, "num_attention_heads", id="zero-heads"),
    pytest.param({"head_dim": 0}, "head_dim", id="zero-head-dim"),
    pytest.param({"num_hidden_layers": 10**30}, "num_hidden_layers", id="huge-layers"),
    pytest.param({"num_key_value_heads": 64}, "num_key_value_heads", id="kv-heads-over-heads"),
    pytest.param({"sliding_window": -5}, "sliding_window", id="negative-window"),
    pytest.param({"layer_types": ["full_attention"] * 100_000}, "layer_types", id="layer-types"),
]


@pytest.mark.parametrize(("override", "named"), BROKEN_CONFIGS)
async def test_diagnose_budget_names_the_broken_config_field(
    memory_engine: RunningEngine, override: dict[str, Any], named: str
) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 256,
        **override,
    }
    async with Client(build_server(memory_engine.settings)) as client:
        message = await call_error(client, "diagnose_budget", {"hf_config": config})
    assert named in message and "Fix the argument" in message


@pytest.mark.parametrize("memory", [1e308, 1e300])
async def test_diagnose_budget_refuses_an_absurd_kv_memory(
    memory_engine: RunningEngine, memory: float
) -> None:
    config = {"architectures": ["X"], "num_hidden_layers": 2, "num_attention_heads": 4}
    config["hidden_size"] = 256
    async with Client(build_server(memory_engine.settings)) as client:
        message = await call_error(
            client, "diagnose_budget", {"hf_config": config, "kv_memory_gib": memory}
        )
    # refused by the schema's bound, before the budget is computed
    assert "kv_memory_gib" in message and "less than or equal to 1048576" in message


@MODES
async def test_an_empty_value_is_refused_and_says_how_to_store_one_through_the_cli(
    memory_engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    key, empty = fresh_key("empty"), tmp_path / "empty.bin"
    empty.write_bytes(b"")
    settings = memory_engine.settings.model_copy(
        update={"file_roots": (tmp_path,), "toolsets": ("kv", "compat")}
    )
    async with Client(build_server(settings), mode=mode) as client:
        messages = [
            await call_error(client, "kv_put", {"key": key, "value_b64": ""}),
            await call_error(client, "kv_put", {"key": key, "file_path": str(empty)}),
            await call_error(
                client, "graph_kvcache", {"action": "put", "key": key, "value_b64": ""}
            ),
        ]
    for message in messages:
        assert "empty" in message and "kv put KEY --allow-empty" in message, message
    assert memory_engine.sync_client().contains(key) == Presence(False)
