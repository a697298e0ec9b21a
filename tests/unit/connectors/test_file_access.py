"""Bounded, non-blocking reads of regular files only, and exclusive creation that never follows a
link or replaces anything."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.files.access import (
    create_exclusive,
    read_regular_file,
)
from graph_kvcache_mcp.errors import FileRefused


def test_a_regular_file_is_read_whole_up_to_the_cap(tmp_path: Path) -> None:
    source = tmp_path / "v.bin"
    source.write_bytes(b"0123456789")
    assert read_regular_file(source, max_bytes=10) == b"0123456789"
    with pytest.raises(FileRefused, match="10 bytes; at most 9"):
        read_regular_file(source, max_bytes=9)


def test_an_endless_device_is_refused_without_reading_it() -> None:
    with pytest.raises(FileRefused, match="character device"):
        read_regular_file(Path("/dev/zero"), max_bytes=1024)


async def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with anyio.fail_after(5), pytest.raises(FileRefused, match="FIFO"):
        await anyio.to_thread.run_sync(lambda: read_regular_file(fifo, max_bytes=1024))


def test_directories_sockets_links_and_missing_files_are_refused(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "target").write_bytes(b"x")
    cases = {
        tmp_path: "directory",
        tmp_path / "sock": "socket",
        tmp_path / "link": "symbolic link",
        tmp_path / "absent": "does not exist",
    }
    try:
        for path, problem in cases.items():
            with pytest.raises(FileRefused, match=problem):
                read_regular_file(path, max_bytes=1024)
    finally:
        listener.close()


def test_create_exclusive_makes_a_private_file_and_never_replaces_or_follows(
    tmp_path: Path,
) -> None:
    target = tmp_path / "value.bin"
    create_exclusive(target, b"first")
    (tmp_path / "dangling").symlink_to(tmp_path / "would-be-created")
    for existing in (target, tmp_path / "dangling"):
        with pytest.raises(FileExistsError):
            create_exclusive(existing, b"second")
    assert target.read_bytes() == b"first"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not (tmp_path / "would-be-created").exists()
