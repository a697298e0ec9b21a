"""vLLM's Prometheus exposition → a typed snapshot for one model, and windows between two.
Pure: no I/O, no clock.

Parsing is prometheus-client's own text parser. A scrape from a busy deployment can run to many
thousand lines (every model, engine, histogram bucket and `_created` series), while a snapshot needs
a few dozen; so `parse_snapshot` first keeps only the lines that can matter (wanted metric names,
and for a chosen model only lines naming it), then hands those to the parser, and checks every
label exactly on the parsed samples. The line filter only ever keeps too much, never too little:
`snapshot_from_families` over a full parse gives the very same snapshot (tests and
`tools/bench_metrics.py` hold it to that).

A family the server does not export reads as `None`, never 0. Counters are summed over engines
(data-parallel ranks), `kv_cache_usage_perc` is their mean, queue gauges their sum.

Modules: `names` (the samples read), `models` (snapshot, delta and their parts), `parse`
(exposition → snapshot), `window` (two snapshots → what moved), `numbers` (the arithmetic they
share).
"""

from graph_kvcache_mcp.domain.vllm.metrics.models import (
    CacheConfig,
    MetricsDelta,
    MetricsSnapshot,
    TtftSummary,
    UnknownModel,
)
from graph_kvcache_mcp.domain.vllm.metrics.parse import (
    count_preemptions,
    parse_snapshot,
    relevant_lines,
    served_models,
    snapshot_from_families,
)
from graph_kvcache_mcp.domain.vllm.metrics.window import baseline_across, delta, restarted, window

__all__ = [
    "CacheConfig",
    "MetricsDelta",
    "MetricsSnapshot",
    "TtftSummary",
    "UnknownModel",
    "baseline_across",
    "count_preemptions",
    "delta",
    "parse_snapshot",
    "relevant_lines",
    "restarted",
    "served_models",
    "snapshot_from_families",
    "window",
]
