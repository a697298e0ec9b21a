"""EngineKVConnector rules that depend on where vLLM runs: the identity's device part and
tensor-parallel keys, and the cache tier its hits count under. Pure."""
