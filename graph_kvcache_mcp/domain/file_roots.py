"""Where tools may read and write files: inside allowed roots. Pure: no I/O.

The roots are `GRAPH_KVCACHE_FILE_ROOTS` when set, else the MCP client's roots when it declares
them, the session can ask and it lists at least one local directory, else the server's working
directory (a client that declares roots but lists none, as the MCP Inspector does, gets that
too: an empty list is no rule, not a rule that allows nothing). A working directory that is
`/`, the home directory or above it is no root at all (`broad_working_dir`): a host that starts
the server there and declares no roots gets file tools that refuse, saying how to set
`GRAPH_KVCACHE_FILE_ROOTS`, instead of tools that read any file. Callers resolve paths (and
roots) with symlinks followed before asking `FileRoots.contains`, so a link inside a root that
points outside it is outside.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath
from urllib.parse import unquote, urlsplit

from graph_kvcache_mcp.errors import ConfigError, quoted, shortened

ROOTS_ENV = "GRAPH_KVCACHE_FILE_ROOTS"
FROM_SETTING = ROOTS_ENV
FROM_CLIENT = "the MCP client's roots"
FROM_WORKING_DIR = "the server's working directory"
FROM_WORKING_DIR_NO_CLIENT_ROOTS = (
    "the server's working directory (the MCP client declares roots but lists no local directory)"
)


@dataclass(frozen=True, slots=True)
class FileRoots:
    """The directories tool paths must lie in, and where that list came from."""

    paths: tuple[PurePath, ...]
    source: str

    def contains(self, resolved: PurePath) -> bool:
        """True when `resolved` (symlinks already followed) is a root or lies below one."""
        return any(resolved == root or resolved.is_relative_to(root) for root in self.paths)

    def refusal(self, param: str, given: str, resolved: PurePath) -> str:
        """Why `given` may not be used, naming the roots and how to widen them."""
        shown = ", ".join(str(root) for root in self.paths) or "(none)"
        where = f" (it resolves to {shortened(str(resolved))})" if str(resolved) != given else ""
        return (
            f"{param} {quoted(given)} is outside the allowed roots{where}. Allowed: {shown}, from "
            f"{self.source}. Use a path inside them, or have the user set {ROOTS_ENV} "
            "(absolute directories separated by the OS path separator) when starting the server"
        )


def roots_from_setting(text: str, *, separator: str) -> tuple[PurePosixPath, ...]:
    """The absolute directories in a `GRAPH_KVCACHE_FILE_ROOTS` value.

    Raises:
        ConfigError: an entry is relative, or the value names no directory at all.
    """
    entries = [entry.strip() for entry in text.split(separator) if entry.strip()]
    relative = [entry for entry in entries if not entry.startswith(("/", "~"))]
    if relative:
        shown = quoted(relative[0])
        raise ConfigError(f"{ROOTS_ENV}: {shown} is relative; give absolute directories")
    if not entries:
        raise ConfigError(f"{ROOTS_ENV} is set but names no directory; unset it or give one")
    return tuple(PurePosixPath(entry) for entry in entries)


def paths_from_root_uris(uris: Iterable[str]) -> tuple[PurePosixPath, ...]:
    """The local directories among a client's root URIs (`file:///...`); others are ignored."""
    paths: list[PurePosixPath] = []
    for uri in uris:
        parts = urlsplit(uri)
        if parts.scheme == "file" and parts.netloc in {"", "localhost"} and parts.path:
            paths.append(PurePosixPath(unquote(parts.path)))
    return tuple(paths)


def broad_working_dir(cwd: PurePath, home: PurePath) -> str | None:
    """What `cwd` (resolved) would open to tool paths as the implicit root when it is too broad
    for one: `/`, the home directory `home` (resolved) or a directory above it. None: fine."""
    if cwd == PurePath(cwd.anchor):
        return "every file on this machine"
    if cwd == home:
        return "the whole home directory"
    if home.is_relative_to(cwd):
        return f"every home directory under {cwd}"
    return None


def broad_working_dir_refusal(cwd: PurePath, opens: str) -> str:
    """Why file tools refuse when the only root would be a too-broad working directory."""
    return (
        f"no file roots: the MCP host declares none and the server's working directory is "
        f"{cwd}, which would open {opens} to tool paths. Have the user set {ROOTS_ENV} to the "
        "absolute directories tools may use (separated by ':') when starting the server, e.g. "
        f"{ROOTS_ENV}=/path/to/project, or start the server from a project directory"
    )
