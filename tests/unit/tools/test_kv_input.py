"""What KV tools accept: strict values, absolute existing files, new files that never overwrite."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp.server.mcpserver.exceptions import ToolError

from graph_kvcache_mcp.errors import InvalidKey, InvalidValue
from graph_kvcache_mcp.tools.kv_input import (
    check_keys,
    decode_value,
    new_file_path,
    read_value_file,
    refused_input,
    value_from,
    write_new_file,
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
            await value_from(value_b64, file_path)


def test_read_value_file_needs_an_absolute_path_to_a_regular_file(tmp_path: Path) -> None:
    source = tmp_path / "v.bin"
    source.write_bytes(b"\x00\x01")
    assert read_value_file(str(source)) == b"\x00\x01"
    for bad, problem in (("v.bin", "relative"), (str(tmp_path), "regular file")):
        with pytest.raises(InvalidValue, match=problem):
            read_value_file(bad)


def test_new_file_path_refuses_relative_missing_dir_existing_and_dangling_links(
    tmp_path: Path,
) -> None:
    (tmp_path / "exists").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    assert new_file_path(str(tmp_path / "new.bin")) == tmp_path / "new.bin"
    cases = {
        "out.bin": "relative",
        str(tmp_path / "no-dir" / "out.bin"): "does not exist",
        str(tmp_path / "exists"): "already exists",
        str(tmp_path / "link"): "already exists",
    }
    for path, problem in cases.items():
        with pytest.raises(ToolError, match=problem):
            new_file_path(path)


def test_write_new_file_creates_a_private_file_and_never_replaces_one(tmp_path: Path) -> None:
    target = tmp_path / "value.bin"
    write_new_file(target, b"first")
    with pytest.raises(FileExistsError):
        write_new_file(target, b"second")
    assert target.read_bytes() == b"first"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
