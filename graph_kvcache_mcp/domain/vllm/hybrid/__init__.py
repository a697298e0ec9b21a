"""Hybrid models (attention beside Mamba2 or gated-delta-net layers): the layout vLLM gives
them, how they launch, what their prefix cache can hold, and the KV plan of their groups."""
