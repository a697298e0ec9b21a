"""vLLM as seen from outside: its OpenAI API, its own routes and /metrics, the managed process.

Public surface: `client.VllmClient` (chat and completion calls, each with its `Trace`),
`access.VllmAccess` (a server session's shared client), `process.ManagedVllm` (its records and
results in `state`, its readiness in `readiness`), `metrics` (scrapes), `routes` (/health,
/tokenize, /version). Code that runs inside vLLM lives in `graph_kvcache_mcp.plugins.vllm_kv`,
not here.
"""
