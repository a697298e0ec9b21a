"""The engine: its managed process, its HTTP wire, and the `/kv/<key>` client every caller uses.

Public surface: `client.KvClient`/`SyncKvClient` (typed outcomes, one deadline per call; the
blocking core lives in `sync_client.py`), `opener.open_kv_client` (which engine, and one client
for it), `access.KvAccess` (a server session's way to the engine, with two policies:
`access.ConfiguredKvAccess` and `managed_access.ManagedKvAccess`), `process.ManagedEngine`. The
rest serves those.
"""
