"""An exposition text → a `MetricsSnapshot` (the package docstring says how lines are kept)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from graph_kvcache_mcp.domain.vllm.metrics.models import CacheConfig, MetricsSnapshot, UnknownModel
from graph_kvcache_mcp.domain.vllm.metrics.names import (
    BY_SOURCE_SAMPLES,
    CACHE_CONFIG,
    CACHED_BY_SOURCE,
    COUNTER_SAMPLES,
    ENGINE_KV_FIELDS,
    EXTERNAL_HITS,
    EXTERNAL_QUERIES,
    GAUGE_SAMPLES,
    GENERATION_TOKENS,
    INF,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROCESS_START,
    PROMPT_BY_SOURCE,
    PROMPT_TOKENS,
    PROMPT_TOKENS_CACHED,
    RUNNING,
    TTFT,
    UNLABELLED_SAMPLES,
    WAITING,
    WANTED_SAMPLES,
    WANTED_TYPE_NAMES,
)
from graph_kvcache_mcp.domain.vllm.metrics.numbers import (
    int_map,
    int_or_none,
    ratio,
    sum_or_none,
    ttft_summary,
)

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


def relevant_lines(text: str, model_name: str | None) -> str:
    """The lines of `text` a snapshot for `model_name` can use (a superset; labels checked later).

    Plain string tests, no regular expressions: the metric name is what precedes `{` or a space,
    and a chosen model's sample line must contain its `model_name="..."` label as the exposition
    format escapes it. `cache_config_info` and the process start time carry no model label, so
    their lines are always kept.
    """
    needle = None if model_name is None else f'model_name="{_escape_label(model_name)}"'
    kept: list[str] = []
    # Only \n ends a line in the text format (str.splitlines also splits on \x1e, \x85, ...).
    for line in text.split("\n"):
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] == "TYPE" and parts[2] in WANTED_TYPE_NAMES:
                kept.append(line)
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.partition(" ")[0]
        if name not in WANTED_SAMPLES:
            continue
        if needle is None or name in UNLABELLED_SAMPLES or needle in line:
            kept.append(line)
    kept.append("")
    return "\n".join(kept)


def parse_snapshot(text: str, model_name: str | None = None) -> MetricsSnapshot:
    """The snapshot for `model_name` (None: every model summed) from an exposition text.

    Raises:
        UnknownModel: a model was named and the exposition has no series for it.
        ValueError: the text is not a Prometheus exposition.
    """
    # The parser loads on first parse: the models here are part of every server's tool list.
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(relevant_lines(text, model_name))
    snapshot = snapshot_from_families(families, model_name, strict=False)
    if model_name is not None and not snapshot.engines:
        raise UnknownModel(model_name, served_models(text))
    return snapshot


def served_models(text: str) -> list[str]:
    """Every `model_name` label value in the exposition (a full parse; for error messages)."""
    from prometheus_client.parser import text_string_to_metric_families

    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:") and "model_name" in sample.labels:
                names.add(sample.labels["model_name"])
    return sorted(names)


def snapshot_from_families(
    families: Iterable[Metric], model_name: str | None, *, strict: bool = True
) -> MetricsSnapshot:
    """Build the snapshot from parsed families (the full-parse path `parse_snapshot` must match).

    Raises:
        UnknownModel: `strict` and a model was named that no series carries.
    """
    acc = _Accumulator(model_name)
    for family in families:
        for sample in family.samples:
            if sample.name in WANTED_SAMPLES:
                acc.add(sample.name, sample.labels, sample.value)
    snapshot = acc.snapshot()
    if strict and model_name is not None and not snapshot.engines:
        raise UnknownModel(model_name, sorted(acc.models_seen))
    return snapshot


class _Accumulator:
    """Sums samples per metric over the engines of the chosen model."""

    def __init__(self, model_name: str | None) -> None:
        self.model_name = model_name
        self.models_seen: set[str] = set()
        self.engines: set[str] = set()
        self.counters: dict[str, float] = {}
        self.by_source: dict[str, dict[str, float]] = {}
        self.gauges: dict[str, list[float]] = {}
        self.buckets: dict[float, float] = {}
        self.ttft_sum: float | None = None
        self.ttft_count: float | None = None
        self.cache_configs: list[dict[str, str]] = []
        self.process_start: float | None = None

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        if name == CACHE_CONFIG:
            self.cache_configs.append(dict(labels))
            return
        if name == PROCESS_START:
            self.process_start = max(value, self.process_start or value)
            return
        model = labels.get("model_name")
        if model is not None:
            self.models_seen.add(model)
        if self.model_name is not None and model != self.model_name:
            return
        self.engines.add(labels.get("engine", ""))
        if name in COUNTER_SAMPLES:
            self.counters[name] = self.counters.get(name, 0.0) + value
        elif name in BY_SOURCE_SAMPLES:
            sources = self.by_source.setdefault(name, {})
            source = labels.get("source", "")
            sources[source] = sources.get(source, 0.0) + value
        elif name in GAUGE_SAMPLES:
            self.gauges.setdefault(name, []).append(value)
        elif name == f"{TTFT}_bucket":
            bound = float(labels.get("le", "+Inf"))
            self.buckets[bound] = self.buckets.get(bound, 0.0) + value
        elif name == f"{TTFT}_sum":
            self.ttft_sum = (self.ttft_sum or 0.0) + value
        elif name == f"{TTFT}_count":
            self.ttft_count = (self.ttft_count or 0.0) + value

    def snapshot(self) -> MetricsSnapshot:
        queries = int_or_none(self.counters.get(PREFIX_QUERIES))
        hits = int_or_none(self.counters.get(PREFIX_HITS))
        ext_queries = int_or_none(self.counters.get(EXTERNAL_QUERIES))
        ext_hits = int_or_none(self.counters.get(EXTERNAL_HITS))
        usage = self.gauges.get(KV_USAGE)
        buckets = sorted((le, round(n)) for le, n in self.buckets.items() if le != INF) or None
        return MetricsSnapshot(
            model_name=self.model_name,
            engines=sorted(e for e in self.engines if e) or sorted(self.engines),
            prefix_cache_queries_tokens=queries,
            prefix_cache_hits_tokens=hits,
            prefix_cache_hit_rate=ratio(hits, queries),
            external_prefix_cache_queries_tokens=ext_queries,
            external_prefix_cache_hits_tokens=ext_hits,
            external_prefix_cache_hit_rate=ratio(ext_hits, ext_queries),
            prompt_tokens=int_or_none(self.counters.get(PROMPT_TOKENS)),
            prompt_tokens_cached=int_or_none(self.counters.get(PROMPT_TOKENS_CACHED)),
            prompt_tokens_by_source=int_map(self.by_source.get(PROMPT_BY_SOURCE)),
            prompt_tokens_cached_by_source=int_map(self.by_source.get(CACHED_BY_SOURCE)),
            generation_tokens=int_or_none(self.counters.get(GENERATION_TOKENS)),
            kv_cache_usage_perc=sum(usage) / len(usage) if usage else None,
            requests_running=int_or_none(sum_or_none(self.gauges.get(RUNNING))),
            requests_waiting=int_or_none(sum_or_none(self.gauges.get(WAITING))),
            ttft=ttft_summary(buckets, self.ttft_sum, self.ttft_count),
            ttft_buckets=buckets,
            cache_config=self._cache_config(),
            process_start_time_s=self.process_start,
            **{
                field: int_or_none(self.counters.get(name))
                for name, field in ENGINE_KV_FIELDS.items()
            },
        )

    def _cache_config(self) -> CacheConfig | None:
        """The config of the chosen model's engines (the info metric carries no model label)."""
        engines = self.engines if self.model_name is not None else None
        matching = [
            labels
            for labels in self.cache_configs
            if engines is None or labels.get("engine", "") in engines
        ]
        distinct = {tuple(sorted(labels.items())) for labels in matching}
        if len(distinct) != 1:
            return None  # none exported, or engines disagree: no single answer to give
        return CacheConfig.from_labels(matching[0])


def count_preemptions(exposition: str, model: str | None) -> int | None:
    """`vllm:num_preemptions_total` summed over engines (for `model`, else all); None if absent.

    Raises:
        ValueError: the text is not a Prometheus exposition.
    """
    from prometheus_client.parser import text_string_to_metric_families

    lines = [line for line in exposition.split("\n") if line.startswith(PREEMPTIONS)]
    total: float | None = None
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name == PREEMPTIONS and model in (None, sample.labels.get("model_name")):
                total = (total or 0.0) + sample.value
    return None if total is None else int(total)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
