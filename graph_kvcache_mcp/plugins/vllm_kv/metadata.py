"""The plan the connector's scheduler side sends its worker side with every step."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from graph_kvcache_mcp.domain.vllm.hybrid.kv_plan import HybridLoad, StateTransfer
from graph_kvcache_mcp.domain.vllm.kv_plan import BlockTransfer


@dataclass
class EngineKVMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's plan, pickled to every worker with the scheduler output."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
    hybrid_loads: list[HybridLoad] = field(default_factory=list)
    state_saves: list[StateTransfer] = field(default_factory=list)
