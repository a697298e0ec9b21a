"""How a KV tier is wired: vLLM's connector and the lmcache server it talks to (`KvWiring`),
and that server's own arguments, coordinator and L2 target (`LmcacheWiring`). Pure.

Each is read once from the command a start builds and recorded with the managed process's state
(`connectors/vllm/state.py`, `connectors/lmcache/state.py`), so restart proofs, the stack's
reuse checks and diagnosis read a typed value instead of parsing a running process's command
line again. A state recorded before the wiring existed is read from its command, in one place:
the state's `wiring` property. A server this data dir did not start (a configured target) is
known only by what it reports of itself: `ReportedLmcacheWiring`, from its GET /config.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.lmcache.coordinator_plan import recorded_coordinator_url
from graph_kvcache_mcp.domain.lmcache.process_spec import L2_ADAPTER_FLAG, flag_value
from graph_kvcache_mcp.domain.vllm.kv_identity_file import IDENTITY_FILE_KEY

KV_TRANSFER_FLAG = "--kv-transfer-config"
TRANSFER_MODE_FLAG = "--supported-transfer-mode"
LMCACHE_DEFAULT_TRANSFER_MODE = "lmcache_driven"
"""`lmcache server`'s default (lmcache/v1/multiprocess/config.py, 0.5.6)."""


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
    return flag_value(command, KV_TRANSFER_FLAG)


def _port(value: Any) -> int | None:
    """`value` as int() reads it (a number or its text), None for anything else JSON held."""
    try:
        return int(value)
    except (ValueError, TypeError):
        return None


class LmcacheWiring(BaseModel):
    """How a managed `lmcache server` runs, as its start command says."""

    model_config = ConfigDict(frozen=True)

    args: list[str] = Field(
        description="Its arguments after the entry point (`lmcache <args>` runs the same server)."
    )
    coordinator_url: str | None = Field(None, description="The LMCache coordinator it joined.")
    transfer_mode: str = Field(description="Its --supported-transfer-mode (or LMCache's default).")
    l2_base_url: str | None = Field(
        None, description="The engine its native_plugin L2 adapter writes to, if that is its L2."
    )


def lmcache_wiring_of(args: Sequence[str]) -> LmcacheWiring:
    """The wiring of an `lmcache server` started with `args` (what follows `lmcache`)."""
    return LmcacheWiring(
        args=list(args),
        coordinator_url=recorded_coordinator_url(args),
        transfer_mode=_flag(args, TRANSFER_MODE_FLAG) or LMCACHE_DEFAULT_TRANSFER_MODE,
        l2_base_url=_l2_base_url(_flag(args, L2_ADAPTER_FLAG)),
    )


def _flag(args: Sequence[str], flag: str) -> str | None:
    """The value after the first `flag` in `args`, None without one."""
    for index, arg in enumerate(args[:-1]):
        if arg == flag:
            return args[index + 1]
    return None


def _l2_base_url(adapter_json: str | None) -> str | None:
    """The `base_url` of a native_plugin L2 adapter's parameters, as written (None otherwise)."""
    try:
        adapter = json.loads(adapter_json) if adapter_json else None
    except ValueError:
        return None
    return _adapter_base_url(adapter)


def _adapter_base_url(adapter: Any) -> str | None:
    """The `base_url` in one L2 adapter's parameters (a native_plugin's), None otherwise."""
    params = adapter.get("adapter_params") if isinstance(adapter, dict) else None
    url = params.get("base_url") if isinstance(params, dict) else None
    return url if isinstance(url, str) else None


class ReportedLmcacheWiring(BaseModel):
    """How an `lmcache server` runs as its own GET /config reports it: what can be known of a
    server this data dir did not start (its command line and environment are where it runs)."""

    model_config = ConfigDict(frozen=True)

    transfer_mode: str = Field(description="Its supported transfer mode (mp.*).")
    rpc_port: int | None = Field(None, description="The ZMQ port vLLM's MP connector uses.")
    l2_base_url: str | None = Field(None, description="The engine its L2 adapter writes to.")


def reported_wiring(config: Mapping[str, Any]) -> ReportedLmcacheWiring:
    """The wiring a server's GET /config body reports (missing parts take LMCache's defaults)."""
    mp = config.get("mp")
    mp = mp if isinstance(mp, dict) else {}
    storage = config.get("storage_manager")
    l2 = storage.get("l2_adapter_config") if isinstance(storage, dict) else None
    adapters = l2.get("adapters") if isinstance(l2, dict) else None
    urls = [url for a in adapters or () if (url := _adapter_base_url(a)) is not None]
    return ReportedLmcacheWiring(
        transfer_mode=str(mp.get("supported_transfer_mode") or LMCACHE_DEFAULT_TRANSFER_MODE),
        rpc_port=_port(mp.get("port")),
        l2_base_url=urls[0] if urls else None,
    )
