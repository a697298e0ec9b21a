"""Reading and creating local files safely: regular files only, bounded, never blocking, never
following a symlink where the file itself is opened, never replacing what exists.

Blocking calls: run them in a worker thread (`anyio.to_thread`) from async code. Where a path may
be read at all (allowed roots) is decided by the caller; see `domain.file_roots`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from graph_kvcache_mcp.errors import FileRefused

_READ_CHUNK_BYTES = 1024 * 1024
_KIND_NAMES = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


def read_regular_file(path: Path, *, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them.

    The file is opened non-blocking (a FIFO never stalls the caller), without following a final
    symlink, and checked with fstat after opening, so what is read is what was checked. At most
    `max_bytes + 1` bytes are ever read: a file that grows meanwhile is still refused.

    Raises:
        FileRefused: missing, not a regular file, unreadable, or larger than `max_bytes`.
    """

    def regular_only(info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"{path} is {_kind(info.st_mode)}, not a regular file")

    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    return _read_bounded(path, flags, max_bytes, regular_only)


def read_input(source: str, *, max_bytes: int, stdin: BinaryIO) -> bytes:
    """What a CLI argument names: `-` for `stdin`, else a file, at most `max_bytes` of it.

    A person at a shell may name any file they can read, so a link is followed and a pipe or
    a device is read too, but never more than `max_bytes + 1` bytes (`/dev/zero`, a huge sparse
    file and an endless pipe are refused, not read into memory).

    Raises:
        FileRefused: missing, a directory, unreadable, an impossible name, or over `max_bytes`.
    """
    if source == "-":
        data = stdin.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise FileRefused(f"standard input is over {max_bytes:,} bytes, the most read here")
        return data
    path = Path(source)
    if "\0" in source:
        raise FileRefused(f"{source!r} contains a NUL byte, which no file name can hold")

    def no_directory(info: os.stat_result) -> None:
        if stat.S_ISDIR(info.st_mode):
            raise FileRefused(f"{path} is a directory; give the path of a file")

    return _read_bounded(path, os.O_RDONLY | os.O_CLOEXEC, max_bytes, no_directory)


def _read_bounded(
    path: Path, flags: int, max_bytes: int, refuse: Callable[[os.stat_result], None]
) -> bytes:
    """Open `path` with `flags`, let `refuse` judge what fstat says it is, then read at most
    `max_bytes` (a regular file is judged by its size first; anything else by what it yields).
    """
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        raise _refusal(path, exc) from None
    try:
        info = os.fstat(descriptor)
        refuse(info)
        if stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
            raise _too_large(path, info.st_size, max_bytes)
        data = _read_at_most(descriptor, max_bytes + 1)
    except OSError as exc:
        raise _refusal(path, exc) from None
    finally:
        os.close(descriptor)
    if len(data) > max_bytes:
        raise _too_large(path, None, max_bytes)
    return data


def create_exclusive(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Create `path` holding `data` (`mode`, 0600 by default); never follows a symlink, never
    replaces anything that exists (a file, a link, a dangling link).

    Raises:
        FileExistsError: something already exists at `path`.
        OSError: the directory is missing or not writable, or the disk is full.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(path, flags, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:
        path.unlink(missing_ok=True)
        raise


def _read_at_most(descriptor: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(descriptor, min(_READ_CHUNK_BYTES, remaining))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    return _KIND_NAMES.get(stat.S_IFMT(mode), "not a regular file")


def _too_large(path: Path, size: int | None, max_bytes: int) -> FileRefused:
    shown = f"is {size:,} bytes" if size is not None else f"holds more than {max_bytes:,} bytes"
    return FileRefused(f"{path} {shown}; at most {max_bytes:,} bytes are read here")


def _refusal(path: Path, exc: OSError) -> FileRefused:
    if exc.errno == errno.ENOENT:
        return FileRefused(f"{path} does not exist")
    if exc.errno == errno.ELOOP:
        return FileRefused(f"{path} is a symbolic link; give the path of the file itself")
    if exc.errno == errno.ENXIO:  # opening a socket, or a FIFO's write end with no reader
        return FileRefused(f"{path} is a socket or similar, not a regular file")
    return FileRefused(f"cannot read {path}: {exc.strerror or exc}")
