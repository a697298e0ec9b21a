"""The bundle signing key: the variable, else one private file per data dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.bundle_secret import bundle_secret
from graph_kvcache_mcp.errors import ConfigError


def test_the_variable_wins_and_nothing_is_written(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, bundle_secret=SecretStr("shared-key"))
    assert bundle_secret(settings) == b"shared-key"
    assert not (tmp_path / "bundle-secret").exists()


def test_one_private_key_per_data_dir_made_once(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path)
    first = bundle_secret(settings)
    assert len(first) == 64 and bundle_secret(settings) == first
    assert (tmp_path / "bundle-secret").stat().st_mode & 0o777 == 0o600
    assert bundle_secret(Settings.build(data_dir=tmp_path / "other")) != first


def test_read_only_creates_nothing_and_reads_no_stored_bundle(tmp_path: Path) -> None:
    key = bundle_secret(Settings.build(data_dir=tmp_path / "fresh", read_only=True))
    assert len(key) == 32 and not (tmp_path / "fresh").exists()


def test_a_key_others_can_read_is_refused_naming_the_file(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path)
    bundle_secret(settings)
    (tmp_path / "bundle-secret").chmod(0o644)
    with pytest.raises(ConfigError, match="bundle-secret: the bundle secret is readable"):
        bundle_secret(settings)
