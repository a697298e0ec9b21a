"""`lmcache server` as seen from outside: the managed process (its records and results in
`state`), its lease, its HTTP admin API.

Code that LMCache itself loads (the L2 adapter, the in-process remote connector) lives in
`graph_kvcache_mcp.plugins.lmcache`, not here.
"""
