"""vLLM's Prometheus exposition → a typed snapshot for one model. Pure: no I/O, no clock.

Parsing is prometheus-client's own text parser. A scrape from a busy deployment can run to many
thousand lines (every model, engine, histogram bucket and `_created` series), while a snapshot needs
a few dozen; so `parse_snapshot` first keeps only the lines that can matter (wanted metric names,
and for a chosen model only lines naming it), then hands those to the parser, and checks every
label exactly on the parsed samples. The line filter only ever keeps too much, never too little:
`snapshot_from_families` over a full parse gives the very same snapshot (tests and
`tools/bench_metrics.py` hold it to that).

A family the server does not export reads as `None`, never 0. Counters are summed over engines
(data-parallel ranks), `kv_cache_usage_perc` is their mean, queue gauges their sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Self

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.vllm.connector_counters import COUNTERS as ENGINE_KV_COUNTERS
from graph_kvcache_mcp.domain.vllm.connector_counters import sample_name
from graph_kvcache_mcp.errors import GraphKvcacheError

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

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
# EngineKVConnector's own counters, when vLLM runs with it: sample name → snapshot field.
ENGINE_KV_FIELDS = {sample_name(name): f"engine_kv_{name}" for name in ENGINE_KV_COUNTERS}

_COUNTERS = (
    PREFIX_QUERIES,
    PREFIX_HITS,
    EXTERNAL_QUERIES,
    EXTERNAL_HITS,
    PROMPT_TOKENS,
    PROMPT_TOKENS_CACHED,
    GENERATION_TOKENS,
    *ENGINE_KV_FIELDS,
)
_BY_SOURCE = (PROMPT_BY_SOURCE, CACHED_BY_SOURCE)
_GAUGES = (KV_USAGE, RUNNING, WAITING)
_TTFT_SAMPLES = (f"{TTFT}_bucket", f"{TTFT}_sum", f"{TTFT}_count")
WANTED_SAMPLES = frozenset((*_COUNTERS, *_BY_SOURCE, *_GAUGES, *_TTFT_SAMPLES, CACHE_CONFIG))
# `# TYPE` lines name the family as exposed: counters keep `_total`, histograms the base name.
_WANTED_TYPE_NAMES = frozenset((*_COUNTERS, *_BY_SOURCE, *_GAUGES, TTFT, CACHE_CONFIG))
_INF = float("inf")


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
            block_size=_int_label(labels.get("block_size")),
            enable_prefix_caching=_bool_label(labels.get("enable_prefix_caching")),
            prefix_caching_hash_algo=labels.get("prefix_caching_hash_algo"),
            kv_cache_memory_bytes=_int_label(labels.get("kv_cache_memory_bytes")),
            num_gpu_blocks=_int_label(labels.get("num_gpu_blocks")),
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
        False, description="A counter went backwards: the server restarted between the scrapes."
    )


# --- parsing ---------------------------------------------------------------------------------


def relevant_lines(text: str, model_name: str | None) -> str:
    """The lines of `text` a snapshot for `model_name` can use (a superset; labels checked later).

    Plain string tests, no regular expressions: the metric name is what precedes `{` or a space,
    and a chosen model's sample line must contain its `model_name="..."` label as the exposition
    format escapes it. `cache_config_info` carries no model label, so its lines are always kept.
    """
    needle = None if model_name is None else f'model_name="{_escape_label(model_name)}"'
    kept: list[str] = []
    # Only \n ends a line in the text format (str.splitlines also splits on \x1e, \x85, ...).
    for line in text.split("\n"):
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] == "TYPE" and parts[2] in _WANTED_TYPE_NAMES:
                kept.append(line)
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.partition(" ")[0]
        if name not in WANTED_SAMPLES:
            continue
        if needle is None or name == CACHE_CONFIG or needle in line:
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

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        if name == CACHE_CONFIG:
            self.cache_configs.append(dict(labels))
            return
        model = labels.get("model_name")
        if model is not None:
            self.models_seen.add(model)
        if self.model_name is not None and model != self.model_name:
            return
        self.engines.add(labels.get("engine", ""))
        if name in _COUNTERS:
            self.counters[name] = self.counters.get(name, 0.0) + value
        elif name in _BY_SOURCE:
            sources = self.by_source.setdefault(name, {})
            source = labels.get("source", "")
            sources[source] = sources.get(source, 0.0) + value
        elif name in _GAUGES:
            self.gauges.setdefault(name, []).append(value)
        elif name == f"{TTFT}_bucket":
            bound = float(labels.get("le", "+Inf"))
            self.buckets[bound] = self.buckets.get(bound, 0.0) + value
        elif name == f"{TTFT}_sum":
            self.ttft_sum = (self.ttft_sum or 0.0) + value
        elif name == f"{TTFT}_count":
            self.ttft_count = (self.ttft_count or 0.0) + value

    def snapshot(self) -> MetricsSnapshot:
        queries = _int(self.counters.get(PREFIX_QUERIES))
        hits = _int(self.counters.get(PREFIX_HITS))
        ext_queries = _int(self.counters.get(EXTERNAL_QUERIES))
        ext_hits = _int(self.counters.get(EXTERNAL_HITS))
        usage = self.gauges.get(KV_USAGE)
        buckets = sorted((le, round(n)) for le, n in self.buckets.items() if le != _INF) or None
        return MetricsSnapshot(
            model_name=self.model_name,
            engines=sorted(e for e in self.engines if e) or sorted(self.engines),
            prefix_cache_queries_tokens=queries,
            prefix_cache_hits_tokens=hits,
            prefix_cache_hit_rate=_ratio(hits, queries),
            external_prefix_cache_queries_tokens=ext_queries,
            external_prefix_cache_hits_tokens=ext_hits,
            external_prefix_cache_hit_rate=_ratio(ext_hits, ext_queries),
            prompt_tokens=_int(self.counters.get(PROMPT_TOKENS)),
            prompt_tokens_cached=_int(self.counters.get(PROMPT_TOKENS_CACHED)),
            prompt_tokens_by_source=_int_map(self.by_source.get(PROMPT_BY_SOURCE)),
            prompt_tokens_cached_by_source=_int_map(self.by_source.get(CACHED_BY_SOURCE)),
            generation_tokens=_int(self.counters.get(GENERATION_TOKENS)),
            kv_cache_usage_perc=sum(usage) / len(usage) if usage else None,
            requests_running=_int(_sum(self.gauges.get(RUNNING))),
            requests_waiting=_int(_sum(self.gauges.get(WAITING))),
            ttft=_ttft(buckets, self.ttft_sum, self.ttft_count),
            ttft_buckets=buckets,
            cache_config=self._cache_config(),
            **{field: _int(self.counters.get(name)) for name, field in ENGINE_KV_FIELDS.items()},
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


# --- windows ---------------------------------------------------------------------------------


def delta(before: MetricsSnapshot, after: MetricsSnapshot) -> MetricsDelta:
    """What moved from `before` to `after`; counters that went backwards mean a restart."""
    fields = (
        "prefix_cache_queries_tokens",
        "prefix_cache_hits_tokens",
        "external_prefix_cache_queries_tokens",
        "external_prefix_cache_hits_tokens",
        "prompt_tokens",
        "prompt_tokens_cached",
        "generation_tokens",
        *ENGINE_KV_FIELDS.values(),
    )
    moved: dict[str, int | None] = {}
    reset = False
    for name in fields:
        diff = _diff(getattr(before, name), getattr(after, name))
        if diff is not None and diff < 0:
            reset, diff = True, None
        moved[name] = diff
    ttft, first_tokens = _ttft_window(before, after)
    if first_tokens is not None and first_tokens < 0:
        reset, ttft, first_tokens = True, None, None
    window = None
    if before.scraped_at is not None and after.scraped_at is not None:
        window = max(0.0, after.scraped_at - before.scraped_at)
    return MetricsDelta(
        model_name=after.model_name,
        window_s=window,
        prefix_cache_hit_rate=_ratio(
            moved["prefix_cache_hits_tokens"], moved["prefix_cache_queries_tokens"]
        ),
        requests_with_first_token=first_tokens,
        ttft=ttft,
        kv_cache_usage_perc=after.kv_cache_usage_perc,
        requests_running=after.requests_running,
        requests_waiting=after.requests_waiting,
        counter_reset=reset,
        **moved,
    )


def _ttft_window(
    before: MetricsSnapshot, after: MetricsSnapshot
) -> tuple[TtftSummary | None, int | None]:
    if before.ttft is None or after.ttft is None:
        return None, None
    count = after.ttft.count - before.ttft.count
    if count < 0:
        return None, count
    buckets = None
    if before.ttft_buckets is not None and after.ttft_buckets is not None:
        # Snapshots read back from JSON carry no buckets: then no quantiles, never wrong ones.
        earlier = dict(before.ttft_buckets)
        buckets = [(le, n - earlier.get(le, 0)) for le, n in after.ttft_buckets]
    return _ttft(buckets or None, after.ttft.sum_s - before.ttft.sum_s, float(count)), count


# --- helpers ---------------------------------------------------------------------------------


def _ttft(
    buckets: list[tuple[float, int]] | None, total_s: float | None, count: float | None
) -> TtftSummary | None:
    if count is None or total_s is None:
        return None
    n = round(count)
    return TtftSummary(
        count=n,
        sum_s=total_s,
        mean_s=total_s / n if n else None,
        p50_s=_histogram_quantile(buckets, n, 0.50),
        p95_s=_histogram_quantile(buckets, n, 0.95),
    )


def _histogram_quantile(
    buckets: list[tuple[float, int]] | None, count: int, q: float
) -> float | None:
    """Prometheus-style quantile: linear within the bucket that holds rank q*count.

    `buckets` are the finite (le, cumulative count) pairs; a rank past the last one can only be
    placed at that bound (the +Inf bucket has no upper edge).
    """
    if not buckets or count <= 0:
        return None
    rank = q * count
    lower_bound, lower_count = 0.0, 0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            span = cumulative - lower_count
            if span <= 0:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / span
        lower_bound, lower_count = bound, cumulative
    return lower_bound


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def _int_map(values: Mapping[str, float] | None) -> dict[str, int] | None:
    return None if values is None else {k: round(v) for k, v in sorted(values.items())}


def _sum(values: list[float] | None) -> float | None:
    return None if values is None else sum(values)


def _diff(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def _ratio(part: int | None, whole: int | None) -> float | None:
    if part is None or not whole:
        return None
    return part / whole


def _int_label(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _bool_label(value: str | None) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    return True if lowered == "true" else False if lowered == "false" else None


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
