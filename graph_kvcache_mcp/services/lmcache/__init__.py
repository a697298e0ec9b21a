"""LMCache use cases: the config plan and the adapter self-check."""
