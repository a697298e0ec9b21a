"""`EngineKVConnector`'s copy path for a KV cache on any torch device (CUDA, or CPU in tests).

Torch only, no numpy: pages addressed in the KV allocation's bytes (`pages`), copies ordered
against the model's stream by events (`streams`), pinned host slots (`slots`), requests whose
blocks stay held until their async saves are done (`held`), and the worker's use of them
(`mover`).
"""
