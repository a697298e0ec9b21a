"""What KV tools accept: strict values, checked keys, exactly one source of bytes."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from graph_kvcache_mcp.errors import InvalidKey, InvalidValue
from graph_kvcache_mcp.tools.kv_input import (
    check_keys,
    decode_value,
    refused_input,
    value_from,
)


@given(st.binary(max_size=2048))
def test_decode_value_round_trips_standard_base64(value: bytes) -> None:
    assert decode_value(base64.b64encode(value).decode()) == value


@pytest.mark.parametrize("text", ["aGVsbG8", "aGVs\nbG8=", "-_-_", "aGVsbG8*"])
def test_decode_value_refuses_lenient_base64(text: str) -> None:
    with pytest.raises(InvalidValue):
        decode_value(text)


def test_check_keys_names_the_first_bad_key() -> None:
    with pytest.raises(InvalidKey) as caught:
        check_keys(["ok:1", "bad key", "stats"])
    assert caught.value.key == "bad key"


def test_refused_input_turns_caller_mistakes_into_tool_errors_naming_the_tool() -> None:
    with (
        pytest.raises(ToolError, match=r"rule: reserved.*call kv_get again"),
        refused_input("kv_get"),
    ):
        check_keys(["stats"])


async def test_value_from_needs_exactly_one_source(tmp_path: Path) -> None:
    for value_b64, file_path in ((None, None), ("eA==", str(tmp_path / "f"))):
        with pytest.raises(InvalidValue, match="exactly one"):
            await value_from(cast(Context[Any], None), value_b64, file_path)
