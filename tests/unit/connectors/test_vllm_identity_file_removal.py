"""The identity record a vLLM restart clears: ours in the private dir, never a user's file named
as `identity_file` in hand-written extra args."""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.connectors.vllm.private_files import remove_identity_file


def test_only_a_record_in_our_private_dir_is_removed(tmp_path: Path) -> None:
    home = tmp_path / "vllm"
    home.mkdir()
    ours = home / "kv-identity.json"
    users = tmp_path / "notes.txt"
    for path in (ours, users):
        path.write_text("x")
    remove_identity_file(str(users), home)
    remove_identity_file(str(ours), home)
    assert users.read_text() == "x" and not ours.exists()
