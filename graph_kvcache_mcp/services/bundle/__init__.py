"""Context bundles: compile through the KV cache, read back, chat over one, measure reuse."""
