"""Older config path of `EngineKVConnector`, kept for configs that name it.

Use `kv_connector_module_path: graph_kvcache_mcp.plugins.vllm_kv.connector`. Importing this
module imports vLLM and torch, as the connector itself does.
"""

from graph_kvcache_mcp.plugins.vllm_kv.connector import EngineKVConnector, EngineKVMetadata

__all__ = ["EngineKVConnector", "EngineKVMetadata"]
