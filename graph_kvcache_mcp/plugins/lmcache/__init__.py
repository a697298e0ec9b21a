"""The engine as LMCache's tier: `l2.EngineL2Client` (`lmcache server --l2-adapter`,
`native_plugin`) and `remote.EngineRemoteConnector` (`remote_storage_plugins`, in-process mode).

The older paths `graph_kvcache_mcp.connectors.lmcache_l2` / `.lmcache_remote` still work.
"""
