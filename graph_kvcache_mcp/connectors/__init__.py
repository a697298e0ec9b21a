"""The only code that does I/O: the engine's KV store, vLLM, LMCache, managed processes."""
