"""Every path a tool reads or writes comes through here: absolute, resolved with symlinks followed,
inside the allowed roots (see `domain.file_roots`), and read bounded off the event loop.

The CLI does not use this module: a person at a shell may name any file they can read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp import MCPError
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import NoBackChannelError
from mcp.types import ListRootsRequest, ListRootsResult

from graph_kvcache_mcp.connectors.files.access import read_regular_file
from graph_kvcache_mcp.connectors.files.hf_config import config_file_of
from graph_kvcache_mcp.connectors.files.working_dir import implicit_root
from graph_kvcache_mcp.domain.file_roots import (
    FROM_CLIENT,
    FROM_SETTING,
    FROM_WORKING_DIR,
    FROM_WORKING_DIR_NO_CLIENT_ROOTS,
    FileRoots,
    paths_from_root_uris,
)
from graph_kvcache_mcp.errors import FileRefused, quoted
from graph_kvcache_mcp.tools._common import state_of

ROOTS_ANSWER_S = 10.0
"""How long a client that declared roots gets to answer roots/list."""


async def allowed_roots(ctx: Context[Any]) -> FileRoots:
    """`GRAPH_KVCACHE_FILE_ROOTS`, else the client's roots (when it declares them, this session
    can ask, and they name a local directory), else the working directory; each resolved with
    symlinks followed.

    Raises:
        ToolError: the client declares roots but answers roots/list with an error or not at all;
            or none apply and the working directory is `/`, the home directory or above it.
    """
    configured = state_of(ctx).settings.file_roots
    if configured is not None:
        roots = FileRoots(tuple(configured), FROM_SETTING)
    else:
        listed = await _client_roots(ctx)
        if listed is not None and listed.paths:
            roots = listed
        else:
            source = FROM_WORKING_DIR if listed is None else FROM_WORKING_DIR_NO_CLIENT_ROOTS
            cwd = await anyio.to_thread.run_sync(working_dir_if_narrow)
            roots = FileRoots((cwd,), source)
    resolved = await anyio.to_thread.run_sync(
        lambda: tuple(Path(os.path.realpath(Path(root).expanduser())) for root in roots.paths)
    )
    return FileRoots(resolved, roots.source)


def working_dir_if_narrow() -> Path:
    """The working directory (resolved), when it may serve as the implicit root.

    Raises:
        ToolError: it is `/`, the home directory or above it; says how to set the roots.
    """
    cwd, refusal = implicit_root()
    if refusal is not None:
        raise ToolError(refusal)
    return cwd


async def path_inside_roots(ctx: Context[Any], given: str, *, param: str) -> Path:
    """`given`, resolved (symlinks followed), when it lies inside the allowed roots.

    Whether the file exists is left to the read, so nothing is revealed about paths outside.

    Raises:
        ToolError: relative, or outside the allowed roots.
    """
    path = _absolute(given, param)
    roots = await allowed_roots(ctx)
    resolved = await anyio.to_thread.run_sync(lambda: Path(os.path.realpath(path)))
    if not roots.contains(resolved):
        raise ToolError(roots.refusal(param, given, resolved))
    return resolved


async def read_inside_roots(ctx: Context[Any], given: str, *, param: str, max_bytes: int) -> bytes:
    """The bytes of a regular file inside the allowed roots, at most `max_bytes` (read in a
    worker thread, opened non-blocking: devices, FIFOs, sockets and directories are refused)."""
    resolved = await path_inside_roots(ctx, given, param=param)
    try:
        return await anyio.to_thread.run_sync(
            lambda: read_regular_file(resolved, max_bytes=max_bytes)
        )
    except FileRefused as exc:
        raise ToolError(f"{param}: {exc}") from None


async def new_file_inside_roots(ctx: Context[Any], given: str, *, param: str) -> Path:
    """Where to create a new file: its directory resolved (symlinks followed) and inside the
    allowed roots, the file itself not existing yet (not even as a dangling link).

    Raises:
        ToolError: relative, no file name, missing directory, outside the roots, or existing.
    """
    path = _absolute(given, param)
    if path.name in {"", ".", ".."}:
        raise ToolError(f"{param} {quoted(given)} names no file; give the path of a new file")
    roots = await allowed_roots(ctx)
    target = await anyio.to_thread.run_sync(lambda: Path(os.path.realpath(path.parent)) / path.name)
    if not roots.contains(target):
        raise ToolError(roots.refusal(param, given, target))
    if not await anyio.to_thread.run_sync(target.parent.is_dir):
        raise ToolError(f"directory {target.parent} does not exist; create it or pick another")
    if await anyio.to_thread.run_sync(os.path.lexists, target):
        raise ToolError(f"{target} already exists and is never overwritten: choose a new path")
    return target


async def hf_config_inside_roots(ctx: Context[Any], given: str, *, param: str) -> Path:
    """The config.json a model path names (the file, or a model directory's config.json), when
    both the given path and the file actually read lie inside the allowed roots.

    Raises:
        ToolError: relative, or either path outside the allowed roots.
    """
    inside = await path_inside_roots(ctx, given, param=param)
    # Check the file actually read as well: a model directory's config.json may link out.
    config_file = await anyio.to_thread.run_sync(config_file_of, inside)
    return await path_inside_roots(ctx, str(config_file), param=param)


def _absolute(given: str, param: str) -> Path:
    if "\0" in given:
        raise ToolError(f"{param} contains a NUL byte, which no file name can hold; fix the path")
    path = Path(given).expanduser()
    if not path.is_absolute():
        raise ToolError(f"{param} {quoted(given)} is relative; give an absolute path")
    return path


async def _client_roots(ctx: Context[Any]) -> FileRoots | None:
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.roots is None:
        return None
    try:
        with anyio.fail_after(ROOTS_ANSWER_S):
            # send_request, not the deprecated list_roots wrapper: same request, no warning.
            answer = await ctx.request_context.session.send_request(
                ListRootsRequest(), ListRootsResult
            )
    except NoBackChannelError:
        # 2026-07-28 sessions cannot ask the client; the configured rule applies instead.
        return None
    except MCPError as exc:
        raise ToolError(f"the client declares file roots but roots/list failed: {exc}") from None
    except TimeoutError:
        raise ToolError(
            f"the client declares file roots but did not answer roots/list in {ROOTS_ANSWER_S:g} s"
        ) from None
    return FileRoots(paths_from_root_uris(str(root.uri) for root in answer.roots), FROM_CLIENT)
