"""vLLM's rules: launch flags, metrics expositions, call accounting, traces, KV-tier plans. Pure."""
