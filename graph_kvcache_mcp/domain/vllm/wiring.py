"""How a vLLM's KV tier is wired: its connector and the lmcache server it talks to. Pure.

Read once from the `--kv-transfer-config` of the command a start builds, and recorded with the
managed vLLM's state (`connectors/vllm/state.py`), so restart proofs, the stack's reuse checks
and diagnosis read a typed value instead of parsing a running process's command line again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.vllm.kv_identity_file import IDENTITY_FILE_KEY

KV_TRANSFER_FLAG = "--kv-transfer-config"


class KvWiring(BaseModel):
    model_config = ConfigDict(frozen=True)

    connector: str | None = Field(
        None, description="The KV connector class vLLM runs (e.g. LMCacheMPConnector)."
    )
    lmcache_port: int | None = Field(None, description="The lmcache server its MP connector uses.")
    lmcache_target: str | None = Field(
        None, description="That server as host:port, or its private ipc:// socket."
    )
    identity_file: str | None = Field(
        None, description="Where EngineKVConnector publishes how it keys blocks."
    )


def wiring_of(command: Sequence[str]) -> KvWiring:
    """The wiring a vLLM command's --kv-transfer-config names (empty without one)."""
    text = transfer_config_text(command)
    if text is None:
        return KvWiring()
    try:
        config = json.loads(text)
    except ValueError:
        return KvWiring(connector="unparsed --kv-transfer-config")
    if not isinstance(config, dict):
        return KvWiring()
    extra = config.get("kv_connector_extra_config")
    port = _port(extra.get("lmcache.mp.port")) if isinstance(extra, dict) else None
    target = None
    if port is not None and isinstance(extra, dict):
        host = str(extra.get("lmcache.mp.host", "tcp://127.0.0.1"))
        target = f"{host.removeprefix('tcp://')}:{port}"
        # The private `ipc://` socket in `lmcache.mp.server_urls` wins: LMCache prefers it.
        urls = extra.get("lmcache.mp.server_urls")
        if isinstance(urls, list) and len(urls) == 1 and str(urls[0]).startswith("ipc://"):
            target = str(urls[0])
    identity = extra.get(IDENTITY_FILE_KEY) if isinstance(extra, dict) else None
    return KvWiring(
        connector=str(config.get("kv_connector")),
        lmcache_port=port,
        lmcache_target=target,
        identity_file=str(identity) if identity else None,
    )


def transfer_config_text(command: Sequence[str]) -> str | None:
    """The raw value of a command's --kv-transfer-config (either spelling), None without one."""
    for index, arg in enumerate(command):
        if arg == KV_TRANSFER_FLAG and index + 1 < len(command):
            return command[index + 1]
        if arg.startswith(KV_TRANSFER_FLAG + "="):
            return arg.split("=", 1)[1]
    return None


def _port(value: Any) -> int | None:
    """`value` as int() reads it (a number or its text), None for anything else JSON held."""
    try:
        return int(value)
    except (ValueError, TypeError):
        return None
