"""Reading EngineKVConnector's identity record: the record, or a reason the fleet view shows."""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import write_private
from graph_kvcache_mcp.connectors.vllm.private_files import read_kv_identity
from graph_kvcache_mcp.domain.vllm.kv_identity_file import (
    IDENTITY_FILE_NAME,
    PublishedKvIdentity,
    identity_file_json,
)

RECORD = PublishedKvIdentity(
    key_scheme=1, identity_digest="ab" * 32, block_size=32, served_model="tiny"
)


def test_a_written_record_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "vllm" / IDENTITY_FILE_NAME
    write_private(path, identity_file_json(RECORD))
    assert read_kv_identity(str(path)) == RECORD


def test_no_file_and_no_path_are_reasons_that_say_what_to_do(tmp_path: Path) -> None:
    missing = read_kv_identity(str(tmp_path / IDENTITY_FILE_NAME))
    assert isinstance(missing, str) and "has not written" in missing
    assert "restart it" in str(read_kv_identity(None))


def test_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    write_private(target, identity_file_json(RECORD))
    link = tmp_path / IDENTITY_FILE_NAME
    link.symlink_to(target)
    assert isinstance(read_kv_identity(str(link)), str)
