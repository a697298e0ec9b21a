"""Read a local Hugging Face `config.json` (a file, or a model directory that holds one).

Local files only: nothing is downloaded. Errors become `ConfigError` naming the path and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.connectors.files.access import read_regular_file
from graph_kvcache_mcp.errors import ConfigError, FileRefused

MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed `config.json` at `path` (or `path/config.json` for a model directory).

    Raises:
        ConfigError: missing, too large, not JSON, or not a JSON object.
    """
    if "\0" in str(path):
        raise ConfigError(f"{str(path)!r} contains a NUL byte, which no file name can hold")
    target = config_file_of(Path(path).expanduser())
    try:
        raw = json.loads(read_regular_file(target.resolve(), max_bytes=MAX_CONFIG_BYTES))
    except FileRefused as exc:
        raise ConfigError(
            f"no config.json to read ({exc}): give the path of a local model's config.json "
            "or of its directory"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{target} is not readable JSON ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{target} holds JSON but not an object: not a model config.json")
    return raw


def config_file_of(path: Path) -> Path:
    """`path` itself, or `path/config.json` when `path` is a (model) directory."""
    return path / "config.json" if path.is_dir() else path


def local_model_config(model: str) -> dict[str, Any] | None:
    """The parsed config.json of `model` when it is a local model directory; None for a hub id
    or a directory without a readable one (vLLM then reports on it itself)."""
    path = Path(model).expanduser()
    if "\0" in model or not (path / "config.json").is_file():
        return None
    try:
        return read_hf_config(path)
    except ConfigError:
        return None
