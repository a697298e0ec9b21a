"""Run by .venv-lmcache's python: LMCache's in-process storage stack with our remote plugin.

Builds the backends from a config dict the way an LMCache worker does (`CreateStorageBackends`),
puts random chunks through `RemoteBackend-graphkv`, checks `contains`, reads them back with
`get_blocking`, and prints one JSON line with what happened. The engine URL comes in argv[1]; the
token in EPISTEMIC_GRAPH_KVCACHE_TOKEN.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend import CreateStorageBackends

PLUGIN = "graphkv"
CHUNK_TOKENS = 16
KV_SHAPE = (2, 2, CHUNK_TOKENS, 2, 64)  # layers, K/V, tokens, heads, head size


def main(base_url: str, namespace: str) -> dict[str, Any]:
    config = LMCacheEngineConfig.from_dict(
        {
            "chunk_size": CHUNK_TOKENS,
            "local_cpu": True,
            "max_local_cpu_size": 0.05,
            "remote_serde": "naive",
            "remote_storage_plugins": [PLUGIN],
            "extra_config": {
                f"remote_storage_plugin.{PLUGIN}.module_path": (
                    "graph_kvcache_mcp.plugins.lmcache.remote"
                ),
                f"remote_storage_plugin.{PLUGIN}.class_name": "EngineRemoteConnector",
                "graphkv.base_url": base_url,
                "graphkv.namespace": namespace,
            },
        }
    )
    metadata = LMCacheMetadata(
        model_name="Qwen/Qwen3-0.6B",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=KV_SHAPE,
        chunk_size=CHUNK_TOKENS,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    backends = CreateStorageBackends(config, metadata, loop)
    names = list(backends)
    cpu, remote = backends["LocalCPUBackend"], backends[f"RemoteBackend-{PLUGIN}"]

    keys, payloads = [], []
    for index in range(3):
        key = CacheEngineKey("Qwen/Qwen3-0.6B", 1, 0, 0xABC000 + index, torch.bfloat16)
        obj = cpu.allocate(metadata.get_shapes(), metadata.get_dtypes(), MemoryFormat.KV_2LTD)
        view = memoryview(obj.byte_array).cast("B")
        data = torch.randint(0, 256, (len(view),), dtype=torch.uint8).numpy().tobytes()
        view[:] = data
        keys.append(key)
        payloads.append(data)
        remote.submit_put_task(key, obj).result(timeout=30)
        obj.ref_count_down()

    deadline = time.monotonic() + 30
    while not all(remote.contains(key) for key in keys) and time.monotonic() < deadline:
        time.sleep(0.05)
    contained = [remote.contains(key) for key in keys]
    absent = remote.contains(CacheEngineKey("Qwen/Qwen3-0.6B", 1, 0, 0xDEAD, torch.bfloat16))
    back = [remote.get_blocking(key) for key in keys]
    equal = [
        obj is not None and bytes(memoryview(obj.byte_array).cast("B")) == data
        for obj, data in zip(back, payloads, strict=True)
    ]
    shapes_kept = [
        obj is not None and list(obj.get_shapes()) == list(metadata.get_shapes()) for obj in back
    ]
    for obj in back:
        if obj is not None:
            obj.ref_count_down()  # the caller of get_blocking owns the object
    for backend in backends.values():
        backend.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    return {
        "backends": names,
        "contained": contained,
        "absent": absent,
        "equal": equal,
        "shapes_kept": shapes_kept,
        "chunk_bytes": len(payloads[0]),
        "keys": [key.to_string() for key in keys],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])), flush=True)
