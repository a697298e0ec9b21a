"""vLLM use cases: chat and metrics, the managed server, the MP stack start, restart proofs."""
