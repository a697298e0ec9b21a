"""`EngineKVConnector`: the engine as vLLM's KV tier (vLLM V1 KV-connector API, CPU vLLM).

Load it into vLLM with

    --kv-transfer-config '{"kv_connector":"EngineKVConnector",
      "kv_connector_module_path":"graph_kvcache_mcp.plugins.vllm_kv.connector",
      "kv_role":"kv_both"}'

and the engine's URL and token in vLLM's environment (`EPISTEMIC_GRAPH_KVCACHE_URL`,
`EPISTEMIC_GRAPH_KVCACHE_TOKEN`; never in `kv_connector_extra_config`, which vLLM logs).

This class is the façade vLLM loads; the work is its two sides' (as vLLM's LMCache connector
hands its calls to an implementation):

- Scheduler side (`plugins.vllm_kv.scheduler_side`, vLLM's EngineCore process): looks the
  request's blocks up in the engine and plans each step's loads and saves.
- Worker side (`plugins.vllm_kv.worker_side`): loads the planned blocks into the paged KV cache
  before the forward pass, copies newly full blocks out after it and queues them for upload.
- Best effort: an engine that is down, slow or answers garbage costs a miss (vLLM recomputes),
  never an exception into vLLM. A block that fails to load is reported to vLLM, which recomputes
  it: the connector sets `kv_load_failure_policy` to "recompute" for that reason.

Handles vLLM's CPU KV cache (one full-attention KV cache group, or a Mamba2 hybrid in align mode:
`plugins.vllm_kv.hybrid`) and either on CUDA (`plugins.vllm_kv.device`: pinned host memory,
side streams, events; with tensor parallelism a dense model's ranks each under their own keys);
pipeline parallel size 1. Anything else is refused at start-up (`plugins.vllm_kv.identity`).
Imports only what vLLM's venv provides.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from graph_kvcache_mcp.domain.vllm.kv_identity_file import IDENTITY_FILE_KEY
from graph_kvcache_mcp.plugins.vllm_kv.engine_calls import logger
from graph_kvcache_mcp.plugins.vllm_kv.hybrid import hybrid_layout, state_identity
from graph_kvcache_mcp.plugins.vllm_kv.identity import ConnectorSetup, model_identity
from graph_kvcache_mcp.plugins.vllm_kv.metadata import EngineKVMetadata
from graph_kvcache_mcp.plugins.vllm_kv.scheduler_side import SchedulerSide
from graph_kvcache_mcp.plugins.vllm_kv.stats import EngineKVPromMetrics, EngineKVStats
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from graph_kvcache_mcp.plugins.vllm_kv.uploads import drain_seconds, give_workers_time_to_drain
from graph_kvcache_mcp.plugins.vllm_kv.worker_side import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["EngineKVConnector", "EngineKVMetadata"]


class EngineKVConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """vLLM KV connector backed by the engine's `/kv/<key>` store."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.identity = model_identity(vllm_config, kv_cache_config)
        self.store = EngineBlockStore.from_environment(os.environ)
        # A hybrid (several KV cache groups): attention blocks plus Mamba states.
        layout = None
        states = None
        if len(kv_cache_config.kv_cache_groups) > 1:
            layout = hybrid_layout(kv_cache_config)
            states = state_identity(self.identity, layout)
        setup = ConnectorSetup(
            self.identity,
            states,
            layout,
            self.store,
            num_blocks=int(kv_cache_config.num_blocks),
            # A device cache's saves copy out after the step (`plugins.vllm_kv.device`).
            async_saves=str(vllm_config.device_config.device_type) != "cpu",
            tensor_parallel=int(vllm_config.parallel_config.tensor_parallel_size),
        )
        self.scheduler = SchedulerSide(setup)
        self.worker = WorkerSide(setup)
        if role == KVConnectorRole.SCHEDULER:
            # vLLM reads the policy right after building this connector. A block that vanished
            # or fails its checksum must cost a recompute, not fail the user's request.
            self._kv_transfer_config.kv_load_failure_policy = "recompute"
            give_workers_time_to_drain(os.environ, drain_seconds(os.environ))
            # One process (the scheduler's) tells the fleet view how this vLLM keys its blocks.
            extra = self._kv_transfer_config.kv_connector_extra_config or {}
            self.scheduler.publish_identity(extra.get(IDENTITY_FILE_KEY), states)
        logger.info(
            "EngineKVConnector (%s) ready: engine %s, identity %s (%s, %d layers, block %d "
            "tokens, %d bytes per block, layout %s)",
            role.name.lower(),
            self.store.client.base_url,
            self.identity.digest,
            self.identity.served_model,
            self.identity.num_layers,
            self.identity.block_size,
            self.identity.block_bytes,
            self.identity.layout,
        )
        if layout is not None and states is not None:
            logger.info(
                "EngineKVConnector: hybrid with KV cache groups %s: attention group %d, Mamba "
                "groups %s, state identity %s (%d bytes per state)",
                self.identity.kv_groups,
                layout.attention_group,
                list(layout.state_groups),
                states.digest,
                states.block_bytes,
            )

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped save is a future miss, nothing more

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        """vLLM's sleep mode (the GPU series' hook) frees and re-allocates the KV cache; the
        device path keeps byte views of the registered allocation (`device.pages`), which would
        then address freed memory. Until `unregister_kv_caches`/`restore_kv_caches` rebuild
        them, vLLM must refuse sleep mode with this connector (the CPU series never asks).
        vLLM asks the class, with the transfer config (`VllmConfig`'s check at start-up)."""
        return False

    # --- scheduler side ----------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.scheduler.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.scheduler.after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        """The engine's tier (host: a memory engine here; disk: a durable one), so vLLM's
        prompt_tokens_cached_by_source counts engine hits under it, not external_unspecified."""
        split = self.scheduler.hit_sources(num_external_tokens)
        return {CacheHitSource(source): tokens for source, tokens in split.items()}

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self.scheduler.step_plan(scheduler_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        # CPU saves copy their blocks out in the step that filled them; a device cache's run
        # after it, so the request is held until the workers report them done.
        return self.scheduler.finished(request)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler.connector_output(connector_output)

    # --- worker side -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker.register(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """vLLM is about to reuse preempted requests' blocks: copies reading them end first."""
        self.worker.wait_for_copies()

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self.store.uploads.step_started()  # vLLM binds before every forward step (worker side)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self.store.uploads.step_ended()

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        if isinstance(metadata, EngineKVMetadata):
            self.worker.start_loads(metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads finish inside start_load_kv, before the forward pass

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return  # whole blocks (all layers) are copied out once per step, in wait_for_save

    def wait_for_save(self) -> None:
        self.store.uploads.step_ended()
        metadata = self._get_connector_metadata()
        if isinstance(metadata, EngineKVMetadata):
            self.worker.save(metadata)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_load_errors()

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        return self.worker.take_transfer_results(finished_req_ids)

    def shutdown(self) -> None:
        """vLLM is stopping: saves still queued go to the engine first (bounded, logged)."""
        if self._role == KVConnectorRole.WORKER:
            self.store.drain(drain_seconds(os.environ))
        self.store.close(flush_timeout_s=0.0)

    # --- stats (worker side; vLLM carries them to its /metrics) ------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        counts = self.store.tally.take()
        return EngineKVStats(data=dict(counts)) if counts else None

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return EngineKVStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[Any], type[Any]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return EngineKVPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
