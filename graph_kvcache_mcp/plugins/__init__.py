"""Code loaded inside another program, importable with that program's dependencies only.

`vllm_kv` runs inside vLLM (torch, vLLM); `lmcache` inside `lmcache server` or LMCache in vLLM.
Nothing here imports the MCP server, its tools, services or commands.
"""
