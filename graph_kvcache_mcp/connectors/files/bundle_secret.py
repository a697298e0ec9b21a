"""The key that signs stored context bundles: `GRAPH_KVCACHE_BUNDLE_SECRET`, else one per data dir.

Without a key, anyone who can write the store could put a forged envelope under a predictable
`ctxbundle:<sha256>` key and have it served as a hit. So a key always exists: the variable when
it is set (servers sharing one store set the same value to share bundles), else
`<data dir>/bundle-secret`, created once, complete and private (0600) like the HTTP token. A
read-only server creates nothing: without the variable or the file it signs with a key of its
own process, so nothing stored verifies and every lookup is a miss.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.private import new_secret, secret_file
from graph_kvcache_mcp.errors import ConfigError

SECRET_FILE_NAME = "bundle-secret"
SECRET_ENV = "GRAPH_KVCACHE_BUNDLE_SECRET"
_PROCESS_KEY = secrets.token_bytes(32)


def bundle_secret(settings: Settings) -> bytes:
    """The bundle signing key for `settings` (see the module docstring).

    Raises:
        ConfigError: the secret file is a link, another user's, or readable by others.
    """
    if settings.bundle_secret is not None:
        return settings.bundle_secret.get_secret_value().encode("utf-8")
    path = settings.data_dir / SECRET_FILE_NAME
    if settings.read_only and not os.path.lexists(path):
        return _PROCESS_KEY
    value = secret_file(path, None if settings.read_only else new_secret)
    _refuse_readable(path)
    if value is None:  # an empty file in read-only mode
        return _PROCESS_KEY
    return value.encode("utf-8")


def _refuse_readable(path: Path) -> None:
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"refusing to use {path}: the bundle secret is readable by others (mode {mode:o}), "
            f"so anyone could forge bundles; remove it (a new one is generated) or set {SECRET_ENV}"
        )
