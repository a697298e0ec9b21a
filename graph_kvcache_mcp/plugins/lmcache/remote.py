"""The engine as a `remote_storage_plugins` entry for LMCache's in-process mode.

LMCache (0.5.6, reference §3) loads `remote_storage_plugin.<name>.module_path` / `.class_name`,
finds a `RemoteConnector` subclass and builds it with `loop=`, `local_cpu_backend=`, `config=`;
its `RemoteBackend` wraps it (serde, timeouts, failure counting, ref counts after puts).

Each chunk is one engine block: LMCache's self-describing `RemoteMetadata` header (length,
shapes, dtypes, format; 28 bytes per KV group) followed by the chunk bytes, so partial chunks and
multi-group layouts come back with their own shape. Keys map through `domain.lmcache_keys` like
the MP client. The async methods use the package's async KV client on LMCache's own event loop;
`exists_sync` uses the blocking core. Failures are logged and read as misses; nothing raises
into LMCache.

Settings come from the YAML's `extra_config` under `graphkv.*` (`graphkv.base_url`,
`graphkv.addr`, `graphkv.timeout_s`, `graphkv.max_connections`, `graphkv.namespace`, and —
discouraged, LMCache logs its config — `graphkv.token`), then the environment as in
`lmcache_l2.EngineL2Client`.

lmcache is imported only when LMCache asks for `EngineRemoteConnector` (module `__getattr__`), so
this module imports without the `[lmcache]` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import cache
from typing import Any

from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.connectors.engine.opener import sync_client_from_params
from graph_kvcache_mcp.domain.engine.limits import MAX_VALUE_BYTES
from graph_kvcache_mcp.domain.lmcache.keys import DEFAULT_NAMESPACE, check_namespace, engine_key
from graph_kvcache_mcp.domain.outcomes import Hit, Presence, Unavailable
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
    if name == CLASS_NAME:
        return _connector_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _connector_class() -> type:
    """Build the `RemoteConnector` subclass; needs lmcache (the `[lmcache]` extra)."""
    try:
        from lmcache.v1.protocol import RemoteMetadata
        from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
    except ImportError as exc:
        raise ImportError(
            f"{CLASS_NAME} runs inside LMCache: install lmcache next to this package "
            "(pip install 'graph-kvcache-mcp[lmcache]')"
        ) from exc

    class EngineRemoteConnector(RemoteConnector):  # type: ignore[misc]
        """LMCache in-process remote storage in the epistemic-graph engine's KV store."""

        def __init__(self, loop: Any, local_cpu_backend: Any, config: Any) -> None:
            super().__init__(config, local_cpu_backend.metadata)
            self.loop = loop
            self.local_cpu_backend = local_cpu_backend
            params = params_from_extra_config(getattr(config, "extra_config", None))
            self.core, self.namespace = core_from_params(params)
            self.kv: KvClient | None = None  # made on LMCache's loop, at first use
            logger.info(
                "LMCache remote connector for %s (namespace %r)",
                self.core.base_url,
                self.namespace,
            )

        def __repr__(self) -> str:
            return f"EngineRemoteConnector({self.core.base_url!r}, namespace={self.namespace!r})"

        def _key(self, key: Any) -> str:
            return engine_key(key.to_string(), namespace=self.namespace)

        def _async(self) -> KvClient:
            if self.kv is None:
                self.kv = KvClient(self.core)
            return self.kv

        async def exists(self, key: Any) -> bool:
            outcome = await self._async().contains(self._key(key))
            return _present(outcome, key)

        def exists_sync(self, key: Any) -> bool:
            return _present(self.core.contains(self._key(key)), key)

        async def get(self, key: Any) -> Any:
            outcome = await self._async().get(self._key(key))
            if isinstance(outcome, Unavailable):
                logger.warning("LMCache get %s read as a miss: %s", key, outcome.reason)
                return None
            if not isinstance(outcome, Hit):
                return None
            return self._unpack(key, outcome.value)

        async def put(self, key: Any, memory_obj: Any) -> None:
            # RemoteBackend drops its reference after this returns: never ref_count_down here.
            kv_bytes = memoryview(memory_obj.byte_array).cast("B")
            header = RemoteMetadata(
                len(kv_bytes),
                memory_obj.get_shapes(),
                memory_obj.get_dtypes(),
                memory_obj.get_memory_format(),
            ).serialize()
            block = bytes(header) + kv_bytes.tobytes()
            if len(block) > MAX_VALUE_BYTES:
                logger.error(
                    "LMCache chunk %s is %d bytes, over the engine's %d-byte cap: not stored; "
                    "lower chunk_size",
                    key,
                    len(block),
                    MAX_VALUE_BYTES,
                )
                return
            outcome = await self._async().put(self._key(key), block)
            if isinstance(outcome, Unavailable):
                logger.warning("LMCache put %s not stored: %s", key, outcome.reason)

        async def list(self) -> list[str]:
            return []  # the engine has no key listing

        async def close(self) -> None:
            self.core.close()

        def _unpack(self, key: Any, block: bytes) -> Any:
            header_size = self.remote_metadata_bytes
            if len(block) < header_size:
                logger.warning("LMCache block %s is shorter than its header: a miss", key)
                return None
            meta = RemoteMetadata.deserialize(memoryview(block)[:header_size])
            if meta.length != len(block) - header_size:
                logger.warning(
                    "LMCache block %s holds %d bytes, header says %d: a miss",
                    key,
                    len(block) - header_size,
                    meta.length,
                )
                return None
            memory_obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
            if memory_obj is None:
                logger.warning("LMCache CPU buffer full: %s read as a miss", key)
                return None
            target = memoryview(memory_obj.byte_array).cast("B")
            if len(target) < meta.length:
                memory_obj.ref_count_down()
                logger.warning("LMCache buffer for %s smaller than the stored chunk: a miss", key)
                return None
            target[: meta.length] = memoryview(block)[header_size:]
            if len(target) != meta.length:
                memory_obj = self.reshape_partial_chunk(memory_obj, meta.length)
            return memory_obj

    def _present(outcome: Presence | Unavailable, key: Any) -> bool:
        if isinstance(outcome, Unavailable):
            logger.warning("LMCache exists %s read as absent: %s", key, outcome.reason)
            return False
        return outcome.present

    EngineRemoteConnector.__module__ = __name__
    return EngineRemoteConnector
