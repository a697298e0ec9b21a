"""Allowed roots: containment on resolved paths, the setting's format, client root URIs."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from graph_kvcache_mcp.domain.file_roots import (
    FROM_SETTING,
    ROOTS_ENV,
    FileRoots,
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
