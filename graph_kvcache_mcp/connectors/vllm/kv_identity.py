"""Read the KV identity record that the managed vLLM's `EngineKVConnector` publishes
(`domain.vllm.kv_identity_file`)."""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import read_private
from graph_kvcache_mcp.domain.vllm.kv_identity_file import (
    MAX_IDENTITY_FILE_BYTES,
    PublishedKvIdentity,
    parse_identity_file,
)
from graph_kvcache_mcp.errors import ConfigError


def read_kv_identity(path: str | None) -> PublishedKvIdentity | str:
    """The connector's record at `path`, or why there is none to use (a reason)."""
    if path is None:
        return (
            "this vLLM was started without an identity file for its EngineKVConnector (by an "
            "older graph-kvcache-mcp): restart it with vllm_restart"
        )
    try:
        text = read_private(Path(path))
    except (ConfigError, OSError) as exc:
        return f"the connector's identity file {path} cannot be read: {exc}"
    if text is None:
        return (
            f"the connector has not written {path} yet (it does once vLLM has set up its KV "
            "cache; see vllm_logs when it stays missing)"
        )
    if len(text) > MAX_IDENTITY_FILE_BYTES:
        return f"the connector's identity file {path} is too large to be its record"
    return parse_identity_file(text)
