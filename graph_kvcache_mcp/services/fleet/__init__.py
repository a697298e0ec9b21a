"""The fleet: several vLLM instances over one shared tier, seen through their KV events."""
