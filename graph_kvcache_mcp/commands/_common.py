"""What every subcommand shares: common flags, settings from flags, printing, exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import anyio
import sniffio
from pydantic import BaseModel

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.access import read_input
from graph_kvcache_mcp.errors import ConfigError, FileRefused, InvalidValue

EXIT_OK = 0
EXIT_MISS = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3

Handler = Callable[[argparse.Namespace, Settings], int]
Verbs: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The sub-parsers of one command group, where each verb adds its parser."""
M = TypeVar("M", bound=BaseModel)
Result = TypeVar("Result")


class CliErrorOut(BaseModel):
    """What `--json` prints on stdout when a command fails before it has a result."""

    error: str
    exit_code: int


def refuse(args: argparse.Namespace, message: str, code: int) -> int:
    """Report a failure: one line on stderr, and with `--json` one `CliErrorOut` on stdout."""
    print(f"error: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(CliErrorOut(error=message, exit_code=code).model_dump_json())
    return code


def common_options() -> argparse.ArgumentParser:
    """Flags every leaf command takes (`--json`, `--data-dir`)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parent.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where managed services keep state (default: $GRAPH_KVCACHE_DATA_DIR or "
        "~/.local/share/graph-kvcache-mcp)",
    )
    return parent


def fleet_options() -> argparse.ArgumentParser:
    """`common_options` and `--fleet`, for the verbs that act on a fleet file's instances."""
    parent = common_options()
    parent.add_argument(
        "--fleet", type=Path, default=None, help="fleet file (default: $GRAPH_KVCACHE_FLEET)"
    )
    return parent


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Environment first, then any flag the command defines and the user set."""
    overrides: dict[str, Any] = {}
    for flag, field in (
        ("data_dir", "data_dir"),
        ("kv_url", "kv_url"),
        ("timeout_s", "kv_timeout_s"),
        ("read_only", "read_only"),
        ("toolsets", "toolsets"),
        ("start_engine", "start_engine"),
        ("keep_engine", "keep_engine"),
        ("vllm_base_url", "vllm_base_url"),
        ("vllm_python", "vllm_python"),
        ("model", "vllm_model"),
    ):
        value = getattr(args, flag, None)
        if value not in (None, False):
            overrides[field] = value
    # A server starts whatever its endpoints say (each bad one disables the toolsets that need
    # it); a one-shot command refuses them at once.
    defer = bool(getattr(args, "defer_endpoint_errors", False))
    return Settings.from_env(defer_endpoint_errors=defer, **overrides)


MAX_BODY_BYTES = 8 * 1024 * 1024


def chat_body(path: Path) -> dict[str, Any]:
    """The chat-completions body (a JSON object) in the file at `path`.

    Raises:
        InvalidValue: unreadable or over MAX_BODY_BYTES (a FIFO, /dev/zero, a huge file).
        ConfigError: not JSON (or nested too deep), or not an object.
    """
    raw = read_cli_input(str(path), max_bytes=MAX_BODY_BYTES, what="a chat request")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path} is not a readable JSON file ({type(exc).__name__})") from None
    if not isinstance(body, dict):
        raise ConfigError(f"{path} holds JSON but not a chat-completions body (an object)")
    return body


def emit(model: BaseModel, *, as_json: bool, human: Callable[[Any], str]) -> None:
    """Print `model` as one JSON object, or as the human summary `human(model)` builds."""
    if as_json:
        print(model.model_dump_json())
    else:
        print(human(model))


def run_async(function: Callable[[], Awaitable[int]]) -> int:
    return anyio.run(function)


def run_blocking(function: Callable[[], Awaitable[Result]]) -> Result:
    """Run an async stack verb to its end for a verb that blocked before it was async: in this
    thread, or, when this thread already runs an event loop (`main()` called from async code),
    in a worker thread with a loop of its own."""
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return anyio.run(function)
    with ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(anyio.run, function).result()


def note(message: str) -> None:
    """Progress for people, on stderr (stdout stays clean for --json and pipes)."""
    print(message, file=sys.stderr, flush=True)


def read_cli_input(source: str, *, max_bytes: int, what: str) -> bytes:
    """The bytes a CLI argument names (`-` = stdin), at most `max_bytes`: the same caps as the
    tools, so `/dev/zero` or a huge file is a clear error (exit 2), never a MemoryError.

    Raises:
        InvalidValue: names the input and why it was refused.
    """
    try:
        return read_input(source, max_bytes=max_bytes, stdin=sys.stdin.buffer)
    except FileRefused as exc:
        raise InvalidValue(f"{what}: {exc}") from None
