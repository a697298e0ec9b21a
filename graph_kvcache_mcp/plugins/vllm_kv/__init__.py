"""`EngineKVConnector`: the engine as vLLM's KV tier. Loaded by vLLM from `connector.py`.

Config path: `kv_connector_module_path: graph_kvcache_mcp.plugins.vllm_kv.connector` (the
older `graph_kvcache_mcp.connectors.vllm_kv_connector` still works).
"""
