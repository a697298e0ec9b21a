"""Private files: 0700/0600, atomic replacement, one winner among creators, links refused."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.files.private import (
    create_private,
    narrow_tree,
    open_private_log,
    private_dir,
    read_private,
    secret_file,
    write_private,
)
from graph_kvcache_mcp.errors import ConfigError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_write_private_creates_a_0600_file_in_a_0700_dir(tmp_path: Path) -> None:
    target = tmp_path / "state" / "state.json"
    write_private(target, "{}")
    assert (_mode(target), _mode(target.parent)) == (0o600, 0o700)
    assert target.read_text() == "{}"


def test_write_private_replaces_the_file_instead_of_truncating_it(tmp_path: Path) -> None:
    target = tmp_path / "token"
    write_private(target, "old")
    before = target.stat().st_ino
    with target.open() as reader:  # a reader holding the old file still reads it whole
        write_private(target, "new")
        assert reader.read() == "old"
    assert target.read_text() == "new" and target.stat().st_ino != before
    assert [p.name for p in tmp_path.iterdir()] == ["token"]  # no temporary file left behind


def test_private_dir_narrows_a_wider_existing_dir(tmp_path: Path) -> None:
    wide = tmp_path / "data"
    wide.mkdir(mode=0o755)
    wide.chmod(0o755)
    private_dir(wide)
    assert _mode(wide) == 0o700


def test_a_shared_sticky_dir_given_as_data_dir_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    private_dir(shared)
    write_private(shared / "engine" / "state.json", "{}")
    assert _mode(shared) == 0o1777 and _mode(shared / "engine") == 0o700


@pytest.mark.parametrize("write", [write_private, create_private])
def test_a_symlinked_private_path_is_refused_and_its_target_untouched(
    tmp_path: Path, write: object
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    victim.chmod(0o644)
    link = tmp_path / "token"
    link.symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        write(link, "secret")  # type: ignore[operator]
    with pytest.raises(ConfigError, match="symbolic link"):
        read_private(link)
    assert victim.read_text() == "keep me" and _mode(victim) == 0o644


def test_a_symlinked_log_is_refused(tmp_path: Path) -> None:
    (tmp_path / "engine.log").symlink_to(tmp_path / "elsewhere.log")
    with pytest.raises(ConfigError, match="symbolic link"):
        open_private_log(tmp_path / "engine.log")
    assert not (tmp_path / "elsewhere.log").exists()


def test_a_wider_existing_log_is_narrowed_to_0600(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("old line\n")
    log.chmod(0o644)
    with open_private_log(log) as handle:
        handle.write(b"new line\n")
    assert _mode(log) == 0o600 and log.read_text() == "old line\nnew line\n"


def test_racing_creators_of_a_secret_all_get_the_first_value(tmp_path: Path) -> None:
    path = tmp_path / "engine" / "token"
    values = iter(range(1000))
    with ThreadPoolExecutor(8) as pool:
        seen = set(pool.map(lambda _: secret_file(path, lambda: f"v{next(values)}"), range(32)))
    assert len(seen) == 1 and seen == {path.read_text()}
    assert _mode(path) == 0o600


def test_secret_file_without_a_maker_creates_nothing(tmp_path: Path) -> None:
    assert secret_file(tmp_path / "engine" / "token") is None
    assert list(tmp_path.iterdir()) == []


def test_narrow_tree_makes_an_older_wide_tree_private_and_leaves_links_alone(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    outside.chmod(0o644)
    home = tmp_path / "engine"
    (home / "store").mkdir(parents=True, mode=0o755)
    (home / "store").chmod(0o755)
    (home / "store" / "data.redb").write_bytes(b"x")
    (home / "store" / "data.redb").chmod(0o644)
    (home / "link").symlink_to(outside)
    narrow_tree(home)
    assert _mode(home / "store") == 0o700 and _mode(home / "store" / "data.redb") == 0o600
    assert _mode(outside) == 0o644


def test_create_private_keeps_the_first_content_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "token"
    assert create_private(target, "one") is True
    assert create_private(target, "two") is False
    assert target.read_text() == "one"
    assert [entry.name for entry in tmp_path.iterdir()] == ["token"]
