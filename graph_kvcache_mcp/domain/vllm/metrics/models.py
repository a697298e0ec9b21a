"""What a snapshot of vLLM's /metrics and a window between two snapshots hold. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.errors import GraphKvcacheError


class UnknownModel(GraphKvcacheError, LookupError):
    """The exposition has no series for the model asked for."""

    def __init__(self, model: str, served: list[str]) -> None:
        self.model = model
        self.served = served
        if served:
            hint = f"it reports {', '.join(served)}: pass one of those"
        else:
            hint = "it reports no vLLM series at all (is it running with --disable-log-stats?)"
        super().__init__(f"vLLM /metrics has no series for model_name={model!r}; {hint}")


class TtftSummary(BaseModel):
    """Time to first token, from vLLM's histogram (quantiles interpolated within buckets)."""

    model_config = ConfigDict(frozen=True)

    count: int
    sum_s: float
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None


class CacheConfig(BaseModel):
    """The engine's `vllm:cache_config_info` labels, with the ones callers need most typed."""

    model_config = ConfigDict(frozen=True)

    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    prefix_caching_hash_algo: str | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Self:
        return cls(
            block_size=int_label(labels.get("block_size")),
            enable_prefix_caching=bool_label(labels.get("enable_prefix_caching")),
            prefix_caching_hash_algo=labels.get("prefix_caching_hash_algo"),
            kv_cache_memory_bytes=int_label(labels.get("kv_cache_memory_bytes")),
            num_gpu_blocks=int_label(labels.get("num_gpu_blocks")),
            labels=dict(sorted(labels.items())),
        )


class MetricsSnapshot(BaseModel):
    """One model's cache and queue state at one scrape. None = the server does not export it."""

    model_config = ConfigDict(frozen=True)

    model_name: str | None = Field(description="The model asked for; None = all models summed.")
    engines: list[str] = Field(default_factory=list)
    prefix_cache_queries_tokens: int | None = None
    prefix_cache_hits_tokens: int | None = None
    prefix_cache_hit_rate: float | None = None
    external_prefix_cache_queries_tokens: int | None = None
    external_prefix_cache_hits_tokens: int | None = None
    external_prefix_cache_hit_rate: float | None = None
    prompt_tokens: int | None = None
    prompt_tokens_cached: int | None = None
    prompt_tokens_by_source: dict[str, int] | None = None
    prompt_tokens_cached_by_source: dict[str, int] | None = None
    generation_tokens: int | None = None
    kv_cache_usage_perc: float | None = None
    requests_running: int | None = None
    requests_waiting: int | None = None
    ttft: TtftSummary | None = None
    ttft_buckets: list[tuple[float, int]] | None = Field(
        None,
        exclude=True,  # only `delta` needs them; kept out of tool and CLI output
        description="Cumulative (le, count) pairs of the TTFT histogram's finite buckets.",
    )
    cache_config: CacheConfig | None = None
    # EngineKVConnector's transfers (graph_kvcache:engine_kv_*_total); None without it.
    engine_kv_loaded_blocks: int | None = None
    engine_kv_loaded_bytes: int | None = Field(
        None, description="Engine bytes the connector read for the blocks it loaded."
    )
    engine_kv_load_failed_blocks: int | None = None
    engine_kv_saved_blocks: int | None = None
    engine_kv_saved_bytes: int | None = None
    engine_kv_dropped_blocks: int | None = None
    scraped_at: float | None = Field(None, description="Unix time of the scrape (set by I/O).")
    process_start_time_s: float | None = Field(
        None, description="When vLLM's server process started (Unix time): a new one = a restart."
    )

    def baseline(self) -> dict[str, Any]:
        """What a later window needs of this snapshot, as JSON data (with the TTFT buckets that
        tool output leaves out); `MetricsSnapshot.model_validate` reads it back."""
        # Not exclude_none: TtftSummary's quantiles are required (None before any request).
        data = self.model_dump(mode="json", exclude={"cache_config"})
        if self.ttft_buckets is not None:
            data["ttft_buckets"] = self.ttft_buckets
        return data


class MetricsDelta(BaseModel):
    """What moved between two snapshots of the same server and model."""

    model_config = ConfigDict(frozen=True)

    model_name: str | None
    window_s: float | None = None
    prefix_cache_queries_tokens: int | None = None
    prefix_cache_hits_tokens: int | None = None
    prefix_cache_hit_rate: float | None = None
    external_prefix_cache_queries_tokens: int | None = None
    external_prefix_cache_hits_tokens: int | None = None
    prompt_tokens: int | None = None
    prompt_tokens_cached: int | None = None
    generation_tokens: int | None = None
    requests_with_first_token: int | None = None
    ttft: TtftSummary | None = None
    engine_kv_loaded_blocks: int | None = None
    engine_kv_loaded_bytes: int | None = None
    engine_kv_load_failed_blocks: int | None = None
    engine_kv_saved_blocks: int | None = None
    engine_kv_saved_bytes: int | None = None
    engine_kv_dropped_blocks: int | None = None
    kv_cache_usage_perc: float | None = Field(None, description="Gauge, as of the later snapshot.")
    requests_running: int | None = None
    requests_waiting: int | None = None
    counter_reset: bool = Field(
        False,
        description="vLLM restarted in the window and its earlier process's final counts are "
        "unknown (an unmanaged restart): the counters are null, never a part.",
    )
    restarts: int = Field(
        0, description="Managed restarts in the window, counted across (final counts recorded)."
    )


def int_label(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def bool_label(value: str | None) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    return True if lowered == "true" else False if lowered == "false" else None
