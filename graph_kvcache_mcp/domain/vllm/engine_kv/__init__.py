"""EngineKVConnector rules that depend on where vLLM runs: the identity's device part and
tensor-parallel keys, the cache tier its hits count under, and the launches it refuses. Pure."""
