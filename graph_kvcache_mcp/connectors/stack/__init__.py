"""The stack as one: what spans the engine, `lmcache server` and vLLM (how the managed vLLM's KV
tier was wired, and in which order the pieces start and stop). Imports each subsystem; none
imports it."""
