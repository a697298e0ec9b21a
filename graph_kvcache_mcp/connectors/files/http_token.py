"""The bearer token the HTTP transport requires: from the environment, else `<data dir>/http-token`.

The file is created once, complete and private (0600), without following a symlink; a second
server racing the first reads the first one's token instead of making another. The token itself
is never logged or printed: callers show the file's path.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.access import read_regular_file
from graph_kvcache_mcp.connectors.files.private import create_private, new_secret
from graph_kvcache_mcp.errors import ConfigError, FileRefused

TOKEN_FILE_NAME = "http-token"
TOKEN_ENV = "GRAPH_KVCACHE_HTTP_TOKEN"
_MAX_TOKEN_FILE_BYTES = 4096


@dataclass(frozen=True)
class HttpToken:
    """The token and where it came from (an env var name or a file path; never the value)."""

    value: SecretStr
    source: str
    created: bool = False


def http_token(settings: Settings) -> HttpToken:
    """`GRAPH_KVCACHE_HTTP_TOKEN` when set, else the data dir's token file (made when missing,
    unless the server is read-only).

    Raises:
        ConfigError: the token file is a symlink, not ours, readable by others, or empty; or
            missing in read-only mode.
    """
    if settings.http_token is not None:
        return HttpToken(settings.http_token, source=TOKEN_ENV)
    path = settings.data_dir / TOKEN_FILE_NAME
    if settings.read_only:  # read-only creates nothing: only a token that already exists
        if not os.path.lexists(path):
            raise ConfigError(
                f"read-only: no HTTP token exists at {path}; set {TOKEN_ENV}, or start the "
                "server once without --read-only to generate that file"
            )
        return HttpToken(_read_token_file(path), source=str(path))
    created = create_private(path, new_secret())
    return HttpToken(_read_token_file(path), source=str(path), created=created)


def _read_token_file(path: Path) -> SecretStr:
    fix = f"remove it (a new one is generated) or set {TOKEN_ENV}"
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid != os.getuid():
            raise ConfigError(f"{path} belongs to another user; {fix}")
        if stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
            raise ConfigError(
                f"{path} is readable by other users (mode {info.st_mode & 0o777:o}); {fix}"
            )
        text = read_regular_file(path, max_bytes=_MAX_TOKEN_FILE_BYTES).decode("ascii").strip()
    except (OSError, FileRefused, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot use the HTTP token file: {exc}; {fix}") from None
    if not text:
        raise ConfigError(f"{path} is empty; {fix}")
    return SecretStr(text)
