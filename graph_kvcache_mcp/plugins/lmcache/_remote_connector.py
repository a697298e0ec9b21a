"""`EngineRemoteConnector`, LMCache's in-process remote storage in the engine (see `remote`).

This module imports lmcache at the top: it is loaded only inside LMCache, through
`remote.EngineRemoteConnector`, so the rest of the package imports without the `[lmcache]` extra.
"""

from __future__ import annotations

import logging
from typing import Any

from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.domain.engine.limits import MAX_VALUE_BYTES
from graph_kvcache_mcp.domain.lmcache.keys import engine_key
from graph_kvcache_mcp.domain.outcomes import Hit, Presence, Unavailable
from graph_kvcache_mcp.plugins.lmcache.remote import core_from_params, params_from_extra_config

logger = logging.getLogger(__name__)


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
