"""Read a local Hugging Face `config.json` (a file, or a model directory that holds one).

Local files only: nothing is downloaded. Errors become `ConfigError` naming the path and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.errors import ConfigError

MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed `config.json` at `path` (or `path/config.json` for a model directory).

    Raises:
        ConfigError: missing, too large, not JSON, or not a JSON object.
    """
    target = Path(path).expanduser()
    if target.is_dir():
        target = target / "config.json"
    try:
        size = target.stat().st_size
    except OSError:
        raise ConfigError(
            f"no config.json at {target}: give the path of a local model's config.json "
            "or of its directory"
        ) from None
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{target} is {size:,} bytes: that is not a model config.json")
    try:
        raw = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{target} is not readable JSON ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{target} holds JSON but not an object: not a model config.json")
    return raw
