"""Secrets for a child process by private file, not by environment variable.

A process's environment is readable back through its APIs: `lmcache server`'s admin HTTP port
answers `GET /env` with all of it, to any local user. So the secrets a managed process needs go
into 0600 files in its private (0700) directory under the data dir, and the child is given only
each file's path, as `<NAME>_FILE`. Our adapters inside vLLM and LMCache read the engine token
from there (`domain.engine.environment.KV_TOKEN_FILE_ENV`); `plugins/lmcache/server.py` hands the
RESP password to LMCache's own `resp` adapter inside the server process.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import private_dir, remove_own, write_private
from graph_kvcache_mcp.domain.engine.environment import KV_TOKEN_ENV

FILE_SUFFIX = "_FILE"
FILED_SECRETS = (KV_TOKEN_ENV, "LMCACHE_RESP_PASSWORD")
"""The secrets the processes we start may need: the engine's bearer token and the RESP password."""


def filed_secrets(env: Mapping[str, str], directory: Path) -> dict[str, str]:
    """`env` with each secret of `FILED_SECRETS` it holds written to `directory/<name>` (0600,
    the directory made private) and replaced by `<NAME>_FILE` naming that file."""
    out = dict(env)
    for name in FILED_SECRETS:
        value = out.pop(name, None)
        if value is None:
            continue
        path = private_dir(directory) / name.lower()
        write_private(path, value)
        out[name + FILE_SUFFIX] = str(path)
    return out


def remove_filed_secrets(directory: Path) -> None:
    """Remove the files `filed_secrets` wrote to `directory` (once the child that read them has
    stopped: a secret on disk outliving its process is one more copy to leak)."""
    for name in FILED_SECRETS:
        remove_own(directory / name.lower())
