"""Private state on disk: directories 0700, files 0600, written atomically, never through a link.

Everything this project keeps under its data dir (state files, secrets, leases, logs, locks) goes
through here. A write builds the whole content in a temporary file created exclusively in the same
directory (O_EXCL|O_NOFOLLOW), syncs it, then renames it over the target, so a reader sees the old
content or the new one, never a truncated file. A path that is a symbolic link is refused: a
planted link must not redirect a secret or widen the mode of whatever it points at.

Everything read as state must be ours: a directory or file owned by another user, or one others
may write, is refused with an error naming it (another local user must not be able to plant a
state file that sends our token to their port). The one exception is a shared directory like
/tmp (sticky and owned by root) as the data dir itself: the sticky bit keeps others from
replacing what we create in it, and what we create is checked in turn.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from graph_kvcache_mcp.connectors.files.access import create_exclusive
from graph_kvcache_mcp.errors import ConfigError

DIR_MODE = 0o700
FILE_MODE = 0o600


def refuse_link(path: Path) -> None:
    """Raise when `path` exists as a symbolic link.

    Raises:
        ConfigError: names the link and what to do about it.
    """
    if path.is_symlink():
        raise ConfigError(
            f"refusing to use {path}: it is a symbolic link, and private state is never read or "
            "written through a link; remove the link (or choose another --data-dir)"
        )


def remove_own(path: Path, kind: Callable[[int], bool] = stat.S_ISREG) -> bool:
    """Remove `path` if it is of `kind` (a `stat.S_IS*` test) and ours, never through a link:
    what a stopped process of ours left behind. Whether it was removed."""
    try:
        info = path.lstat()
    except OSError:
        return False
    if not kind(info.st_mode) or info.st_uid != os.getuid():
        return False
    path.unlink(missing_ok=True)
    return True


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) and make sure only the owner can enter it (0700).

    An existing directory is narrowed only when it is ours and not a shared one (sticky bit, as
    /tmp has): `--data-dir /tmp` must not lock everyone else out of /tmp. What we keep inside
    lives in subdirectories this function creates 0700, so it stays private either way.

    Raises:
        ConfigError: `path` is a link, or a directory of another user (see `check_owned`).
    """
    refuse_link(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    info = path.lstat()
    check_owned(path, info)
    if stat.S_IMODE(info.st_mode) != DIR_MODE and not info.st_mode & stat.S_ISVTX:
        os.chmod(path, DIR_MODE)
    return path


def check_owned(path: Path, info: os.stat_result, *, narrowing: bool = False) -> None:
    """Refuse state another user owns or may change: `path` must be ours, and a file must not
    be writable by group or others (unless the caller is `narrowing` it to 0600 right now). A
    sticky directory (like /tmp) is shared on purpose and may belong to root; a directory of
    ours others may write is narrowed by `private_dir`.

    Raises:
        ConfigError: names the path, its owner and mode, and the fix.
    """
    mine = info.st_uid == os.getuid()
    if stat.S_ISDIR(info.st_mode):
        if mine or (info.st_uid == 0 and info.st_mode & stat.S_ISVTX):
            return
    elif mine and (narrowing or not stat.S_IMODE(info.st_mode) & 0o022):
        return
    raise ConfigError(
        f"refusing to use {path}: it belongs to uid {info.st_uid} with mode "
        f"{stat.S_IMODE(info.st_mode):o}, and state this program reads must be yours "
        f"(uid {os.getuid()}) and writable only by you; someone else may have planted it. "
        "Remove it (or choose a --data-dir of your own, not in a shared directory)"
    )


def narrow_tree(root: Path) -> None:
    """Make an existing tree private: directories 0700, regular files 0600; links untouched.

    For data dirs written before everything was private (a 0644 store, 0755 directories).
    """
    for directory, subdirs, files in os.walk(root):  # os.walk does not follow links
        for name in (directory, *(os.path.join(directory, d) for d in subdirs)):
            _narrow(Path(name), DIR_MODE)
        for name in files:
            _narrow(Path(directory, name), FILE_MODE)


def _narrow(path: Path, mode: int) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode) or stat.S_IMODE(info.st_mode) & ~mode == 0:
        return
    if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
        os.chmod(path, mode, follow_symlinks=False)


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically, as a 0600 file in a 0700 directory.

    Raises:
        ConfigError: `path` is a symbolic link.
    """
    refuse_link(path)
    private_dir(path.parent)
    temporary = _write_temporary(path, text.encode())
    try:
        os.rename(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_dir(path.parent)


def create_private(path: Path, text: str) -> bool:
    """Create `path` with `text` (0600) only when it does not exist yet; True when this call did.

    The content appears complete or not at all, and of two racing creators exactly one wins.

    Raises:
        ConfigError: `path` is a symbolic link.
    """
    refuse_link(path)
    private_dir(path.parent)
    temporary = _write_temporary(path, text.encode())
    try:
        os.link(temporary, path)  # fails when the target exists: first creator wins
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)
    _sync_dir(path.parent)
    return True


def read_private(path: Path) -> str | None:
    """The text of `path`, None when it does not exist; a link is never followed.

    Raises:
        ConfigError: `path` is a symbolic link, or it or its directory is another user's or
            writable by others (`check_owned`).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if path.is_symlink():
            refuse_link(path)
        raise exc
    with os.fdopen(descriptor, "r", encoding="utf-8") as handle:
        check_owned(path.parent, path.parent.lstat())
        check_owned(path, os.fstat(handle.fileno()))
        return handle.read()


def secret_file(path: Path, make: Callable[[], str] | None = None) -> str | None:
    """The secret stored in `path`; created with `make()` when missing and `make` is given.

    Two processes asking at once get the same value (see `create_private`). Without `make`,
    nothing is created and a missing secret is None (read-only use).

    Raises:
        ConfigError: `path` is a symbolic link.
    """
    existing = read_private(path)
    if existing is not None and existing.strip():
        return existing.strip()
    if make is None:
        return None
    if existing is not None:  # an empty file left by an older, non-atomic writer
        write_private(path, make())
    else:
        create_private(path, make())
    value = read_private(path)
    return value.strip() if value else None


def new_secret() -> str:
    return secrets.token_hex(32)


def open_private_log(path: Path) -> IO[bytes]:
    """`path` opened for appending, created 0600 (an older, wider log is narrowed to 0600).

    Raises:
        ConfigError: `path` is a symbolic link.
    """
    refuse_link(path)
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(path, flags, FILE_MODE)
    try:
        check_owned(path, os.fstat(descriptor), narrowing=True)
        os.fchmod(descriptor, FILE_MODE)
    except BaseException:
        os.close(descriptor)
        raise
    return os.fdopen(descriptor, "ab")


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an flock on `lock_path` (0600) so lifecycle steps of two processes never interleave."""
    with open_private_log(lock_path) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_temporary(path: Path, content: bytes) -> Path:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    create_exclusive(temporary, content, mode=FILE_MODE)
    return temporary


def _sync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk too.
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
