"""Code loaded inside another program, importable with that program's dependencies only.

`vllm_kv` runs inside vLLM (torch, vLLM); `lmcache` inside `lmcache server` or LMCache in vLLM;
`vllm_dev_routes` in front of a dev-mode vLLM's HTTP app; `owner_only` is the filter they share.
Nothing here imports the MCP server, its tools, services or commands.
"""
