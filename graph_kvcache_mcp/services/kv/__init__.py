"""KV store use cases: the probe and the output models of the kv_* tools and commands."""
