"""The HTTP bearer token: taken from the environment, else generated once into the data dir."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.http_token import TOKEN_ENV, TOKEN_FILE_NAME, http_token
from graph_kvcache_mcp.errors import ConfigError


def test_the_environment_token_wins_and_no_file_is_written(tmp_path: Path) -> None:
    found = http_token(Settings.build(data_dir=tmp_path, http_token=SecretStr("from-env")))
    assert (found.value.get_secret_value(), found.source) == ("from-env", TOKEN_ENV)
    assert list(tmp_path.iterdir()) == []


def test_a_generated_token_lands_in_a_private_file_and_is_reused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = http_token(Settings.build(data_dir=data_dir))
    path = data_dir / TOKEN_FILE_NAME
    assert first.created and first.source == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert len(first.value.get_secret_value()) == 64
    assert first.value.get_secret_value() not in repr(first)
    again = http_token(Settings.build(data_dir=data_dir))
    assert not again.created and again.value == first.value
    assert [entry.name for entry in data_dir.iterdir()] == [TOKEN_FILE_NAME]


def test_racing_servers_all_end_up_with_the_first_token(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path)
    with ThreadPoolExecutor(max_workers=8) as pool:
        tokens = list(pool.map(lambda _: http_token(settings), range(32)))
    assert len({token.value.get_secret_value() for token in tokens}) == 1
    assert sum(token.created for token in tokens) == 1


def test_a_symlink_at_the_token_path_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("attacker-chosen")
    target.chmod(0o600)
    (tmp_path / TOKEN_FILE_NAME).symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        http_token(Settings.build(data_dir=tmp_path))
    assert target.read_text() == "attacker-chosen"


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / TOKEN_FILE_NAME
    path.write_text("leaked-token")
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by other users") as caught:
        http_token(Settings.build(data_dir=tmp_path))
    assert "leaked-token" not in str(caught.value)


def test_an_empty_token_file_is_refused_not_served_open(tmp_path: Path) -> None:
    path = tmp_path / TOKEN_FILE_NAME
    path.touch(mode=0o600)
    with pytest.raises(ConfigError, match="empty"):
        http_token(Settings.build(data_dir=tmp_path))


def test_read_only_uses_an_existing_token_file_and_never_creates_one(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with pytest.raises(ConfigError, match=f"read-only: no HTTP token exists.*{TOKEN_ENV}"):
        http_token(Settings.build(data_dir=data_dir, read_only=True))
    assert not data_dir.exists()
    made = http_token(Settings.build(data_dir=data_dir))
    found = http_token(Settings.build(data_dir=data_dir, read_only=True))
    assert found.value == made.value and not found.created
