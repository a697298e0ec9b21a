"""The counters EngineKVConnector adds to vLLM's /metrics: their names and what they count.

Shared by the connector, which registers them inside vLLM (`plugins.vllm_kv.stats`), and the
/metrics parser (`domain.vllm.metrics`), which reads them back. Pure: names only.
"""

from __future__ import annotations

METRIC_PREFIX = "graph_kvcache:engine_kv_"

COUNTERS: dict[str, str] = {
    "loaded_blocks": "KV blocks EngineKVConnector loaded from the engine into vLLM's KV cache.",
    "loaded_bytes": "Engine bytes read for the KV blocks EngineKVConnector loaded.",
    "load_failed_blocks": "KV blocks the engine could not supply intact (vLLM recomputed them).",
    "saved_blocks": "KV blocks EngineKVConnector stored in the engine (acknowledged, new).",
    "saved_bytes": "Bytes of the KV blocks EngineKVConnector stored in the engine.",
    "dropped_blocks": "KV blocks not saved: the engine was down or uploads were behind.",
}
"""Counter name (under `METRIC_PREFIX`) → its help text."""


def sample_name(counter: str) -> str:
    """The counter's sample name in the exposition (Prometheus appends `_total`)."""
    return f"{METRIC_PREFIX}{counter}_total"
