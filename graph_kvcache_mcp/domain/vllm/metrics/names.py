"""The vLLM samples a snapshot reads, as they appear in the exposition. Pure."""

from __future__ import annotations

from graph_kvcache_mcp.domain.vllm.connector_counters import COUNTERS as ENGINE_KV_COUNTERS
from graph_kvcache_mcp.domain.vllm.connector_counters import sample_name

# Sample names as they appear in the exposition (counters carry `_total`).
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached_total"
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
TTFT = "vllm:time_to_first_token_seconds"
CACHE_CONFIG = "vllm:cache_config_info"
# prometheus_client's process collector in vLLM's API server: a new value is a new process.
PROCESS_START = "process_start_time_seconds"
# EngineKVConnector's own counters, when vLLM runs with it: sample name → snapshot field.
ENGINE_KV_FIELDS = {sample_name(name): f"engine_kv_{name}" for name in ENGINE_KV_COUNTERS}

COUNTER_SAMPLES = (
    PREFIX_QUERIES,
    PREFIX_HITS,
    EXTERNAL_QUERIES,
    EXTERNAL_HITS,
    PROMPT_TOKENS,
    PROMPT_TOKENS_CACHED,
    GENERATION_TOKENS,
    *ENGINE_KV_FIELDS,
)
BY_SOURCE_SAMPLES = (PROMPT_BY_SOURCE, CACHED_BY_SOURCE)
GAUGE_SAMPLES = (KV_USAGE, RUNNING, WAITING)
TTFT_SAMPLES = (f"{TTFT}_bucket", f"{TTFT}_sum", f"{TTFT}_count")
WANTED_SAMPLES = frozenset(
    (
        *COUNTER_SAMPLES,
        *BY_SOURCE_SAMPLES,
        *GAUGE_SAMPLES,
        *TTFT_SAMPLES,
        CACHE_CONFIG,
        PROCESS_START,
    )
)
# `# TYPE` lines name the family as exposed: counters keep `_total`, histograms the base name.
WANTED_TYPE_NAMES = frozenset(
    (*COUNTER_SAMPLES, *BY_SOURCE_SAMPLES, *GAUGE_SAMPLES, TTFT, CACHE_CONFIG, PROCESS_START)
)
UNLABELLED_SAMPLES = frozenset((CACHE_CONFIG, PROCESS_START))
"""Samples without a model label: kept whichever model a snapshot is for."""
INF = float("inf")
