"""EngineKVConnector's transfer counters, carried to vLLM's own /metrics.

The worker side adds to a `TransferTally` (`plugins.vllm_kv.engine_calls`) as it loads and saves
blocks. After every forward step vLLM asks the connector for its stats (`get_kv_connector_stats`),
ships them to the scheduler and on to the API server, which hands them to the connector's
Prometheus metrics (`EngineKVPromMetrics.observe`) and, summed per log interval, to its "KV
Transfer metrics" log line. So `/metrics` carries, beside vLLM's own series, counters such as

    graph_kvcache:engine_kv_loaded_bytes_total{engine="0",model_name="..."}

which is what lets a chat trace say how many engine bytes its external hit read
(`domain.vllm.metrics` parses them). A save is counted when the engine acknowledged it, on the
upload thread, and therefore shows at the step after; a load is counted in the step that used it.

Runs inside vLLM's processes: imports vLLM, the standard library and this package only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from graph_kvcache_mcp.domain.vllm.connector_counters import COUNTERS, METRIC_PREFIX

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass
class EngineKVStats(KVConnectorStats):  # type: ignore[misc]
    """vLLM's stats container for our counters: `data` maps counter name → amount."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, amount in other.data.items():
            if name in COUNTERS and isinstance(amount, int):
                self.data[name] = self.data.get(name, 0) + amount
        return self

    def reduce(self) -> dict[str, int | float]:
        return {name: int(amount) for name, amount in sorted(self.data.items())}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class EngineKVPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """One Prometheus counter per entry of `COUNTERS`, labelled like vLLM's own series."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[Any], type[Any]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._children: dict[tuple[str, int], Any] = {}
        for name, help_text in COUNTERS.items():
            counter = self._counter_cls(
                name=METRIC_PREFIX + name, documentation=help_text, labelnames=labelnames
            )
            for engine, values in per_engine_labelvalues.items():
                self._children[name, engine] = counter.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, amount in transfer_stats_data.items():
            child = self._children.get((name, engine_idx))
            if child is not None and isinstance(amount, int) and amount > 0:
                child.inc(amount)
