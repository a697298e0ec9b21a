"""The engine as a `remote_storage_plugins` entry for LMCache's in-process mode.

LMCache (0.5.6, reference §3) loads `remote_storage_plugin.<name>.module_path` / `.class_name`,
finds a `RemoteConnector` subclass and builds it with `loop=`, `local_cpu_backend=`, `config=`;
its `RemoteBackend` wraps it (serde, timeouts, failure counting, ref counts after puts).

Each chunk is one engine block: LMCache's self-describing `RemoteMetadata` header (length,
shapes, dtypes, format; 28 bytes per KV group) followed by the chunk bytes, so partial chunks and
multi-group layouts come back with their own shape. Keys map through `domain.lmcache.keys` like
the MP client. The async methods use the package's async KV client on LMCache's own event loop;
`exists_sync` uses the blocking core. Failures are logged and read as misses; nothing raises
into LMCache.

Settings come from the YAML's `extra_config` under `graphkv.*` (`graphkv.base_url`,
`graphkv.addr`, `graphkv.timeout_s`, `graphkv.max_connections`, `graphkv.namespace`, and —
discouraged, LMCache logs its config — `graphkv.token`), then the environment as in
`lmcache_l2.EngineL2Client`.

The class itself lives in `_remote_connector`, which imports lmcache; this module loads it only
when LMCache asks for `EngineRemoteConnector` (module `__getattr__`), so it imports without the
`[lmcache]` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.opener import sync_client_from_params
from graph_kvcache_mcp.domain.lmcache.keys import DEFAULT_NAMESPACE, check_namespace
from graph_kvcache_mcp.errors import ConfigError

logger = logging.getLogger(__name__)

EXTRA_CONFIG_PREFIX = "graphkv."
CLASS_NAME = "EngineRemoteConnector"
_KNOWN_PARAMS = ("base_url", "addr", "token", "timeout_s", "max_connections", "namespace")


def params_from_extra_config(extra_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Our `graphkv.*` entries of LMCache's `extra_config`, without the prefix.

    Raises:
        ConfigError: an unknown `graphkv.*` key (a typo would otherwise be ignored silently).
    """
    params: dict[str, Any] = {}
    for key, value in (extra_config or {}).items():
        if not key.startswith(EXTRA_CONFIG_PREFIX):
            continue
        name = key.removeprefix(EXTRA_CONFIG_PREFIX)
        if name not in _KNOWN_PARAMS:
            raise ConfigError(
                f"extra_config key {key!r} is not one graph-kvcache-mcp reads; use "
                + ", ".join(EXTRA_CONFIG_PREFIX + p for p in _KNOWN_PARAMS)
            )
        params[name] = value
    return params


def core_from_params(params: Mapping[str, Any]) -> tuple[SyncKvClient, str]:
    """The blocking KV core and key namespace for `params`, falling back to the environment."""
    addr, token = params.get("addr"), params.get("token")
    timeout, connections = params.get("timeout_s"), params.get("max_connections")
    core = sync_client_from_params(
        base_url=params.get("base_url"),
        addr=str(addr) if addr else None,
        token=str(token) if token else None,
        timeout_s=float(timeout) if timeout is not None else None,
        concurrency=int(connections) if connections is not None else None,
    )
    return core, check_namespace(str(params.get("namespace") or DEFAULT_NAMESPACE))


def __getattr__(name: str) -> Any:
    if name != CLASS_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from graph_kvcache_mcp.plugins.lmcache import _remote_connector
    except ImportError as exc:
        raise ImportError(
            f"{CLASS_NAME} runs inside LMCache: install lmcache next to this package "
            "(pip install 'graph-kvcache-mcp[lmcache]')"
        ) from exc
    return _remote_connector.EngineRemoteConnector
