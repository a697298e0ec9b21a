"""Allowed roots: containment on resolved paths, the setting's format, client root URIs."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from graph_kvcache_mcp.domain.file_roots import (
    FROM_SETTING,
    ROOTS_ENV,
    FileRoots,
    broad_working_dir,
    broad_working_dir_refusal,
    paths_from_root_uris,
    roots_from_setting,
)
from graph_kvcache_mcp.errors import ConfigError

ROOTS = FileRoots((PurePosixPath("/work/project"), PurePosixPath("/data")), FROM_SETTING)


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("/work/project", True),
        ("/work/project/a/b.bin", True),
        ("/data/x", True),
        ("/work/project-other/x", False),
        ("/work", False),
        ("/etc/passwd", False),
    ],
)
def test_contains_means_the_root_itself_or_below_it(path: str, inside: bool) -> None:
    assert ROOTS.contains(PurePosixPath(path)) is inside


def test_a_refusal_names_the_roots_their_source_and_the_variable() -> None:
    message = ROOTS.refusal("file_path", "/work/project/link", PurePosixPath("/etc/shadow"))
    assert "/work/project, /data" in message and ROOTS_ENV in message
    assert "resolves to /etc/shadow" in message


def test_the_setting_takes_absolute_directories_only() -> None:
    assert roots_from_setting("/a: /b/c :", separator=":") == (
        PurePosixPath("/a"),
        PurePosixPath("/b/c"),
    )
    for bad in ("relative/dir", "/a:b", ":"):
        with pytest.raises(ConfigError, match=ROOTS_ENV):
            roots_from_setting(bad, separator=":")


def test_only_local_file_uris_become_roots() -> None:
    uris = ["file:///home/me/my%20project", "file://localhost/srv", "https://x/y", "file://h/z"]
    assert paths_from_root_uris(uris) == (
        PurePosixPath("/home/me/my project"),
        PurePosixPath("/srv"),
    )


@pytest.mark.parametrize(
    ("cwd", "opens"),
    [
        ("/", "every file on this machine"),
        ("/home/ada", "the whole home directory"),
        ("/home", "every home directory under /home"),
        ("/home/ada/project", None),
        ("/srv/data", None),
    ],
)
def test_a_working_directory_at_or_above_home_is_too_broad_to_be_the_implicit_root(
    cwd: str, opens: str | None
) -> None:
    assert broad_working_dir(PurePosixPath(cwd), PurePosixPath("/home/ada")) == opens


def test_the_broad_working_dir_refusal_says_how_to_set_the_roots() -> None:
    message = broad_working_dir_refusal(PurePosixPath("/"), "every file on this machine")
    assert f"{ROOTS_ENV}=" in message and "declares none" in message and "/" in message
