"""Steering LMCache's tiers through its coordinator: warm, evict, pin (the `cache` toolset)."""
