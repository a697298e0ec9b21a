"""`EngineKVConnector`: the engine as vLLM's KV tier (vLLM V1 KV-connector API, CPU vLLM).

Load it into vLLM with

    --kv-transfer-config '{"kv_connector":"EngineKVConnector",
      "kv_connector_module_path":"graph_kvcache_mcp.plugins.vllm_kv.connector",
      "kv_role":"kv_both"}'

and the engine's URL and token in vLLM's environment (`EPISTEMIC_GRAPH_KVCACHE_URL`,
`EPISTEMIC_GRAPH_KVCACHE_TOKEN`; never in `kv_connector_extra_config`, which vLLM logs).

- Scheduler side (vLLM's EngineCore process): names each full block of a request by a chained
  content key (`domain.vllm.kv_blocks`), asks the engine for the longest present run of them after
  vLLM's own prefix-cache hit, and plans loads and saves (`domain.vllm.kv_plan`).
- Worker side: before the forward pass, reads the planned blocks, checks each value's header and
  checksum, and writes them into the paged KV cache; after the pass (`wait_for_save`), copies the
  newly full blocks out and queues them for upload.
- Best effort: an engine that is down, slow or answers garbage costs a miss (vLLM recomputes),
  never an exception into vLLM. A block that fails to load is reported to vLLM, which recomputes
  it: the connector sets `kv_load_failure_policy` to "recompute" for that reason.

Handles vLLM's CPU KV cache only (one full-attention KV cache group, or a Mamba2 hybrid in align
mode: `plugins.vllm_kv.hybrid`; tensor and pipeline parallel size 1); anything else is refused at
start-up. Imports only what vLLM's venv provides.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)

from graph_kvcache_mcp.connectors.files.private import write_private
from graph_kvcache_mcp.domain.vllm.kv_blocks import (
    KvModelIdentity,
    encode_block,
    unsupported_hybrid,
    unsupported_setup,
)
from graph_kvcache_mcp.domain.vllm.kv_hybrid_plan import HybridLoad, HybridPlanner, StateTransfer
from graph_kvcache_mcp.domain.vllm.kv_identity_file import (
    IDENTITY_FILE_KEY,
    identity_file_json,
    published_identity,
)
from graph_kvcache_mcp.domain.vllm.kv_plan import (
    BlockTransfer,
    ScheduledRequest,
    StepPlan,
    TransferPlanner,
)
from graph_kvcache_mcp.plugins.vllm_kv.hybrid import (
    HybridLayout,
    HybridPages,
    hybrid_layout,
    state_identity,
)
from graph_kvcache_mcp.plugins.vllm_kv.pages import PagedKvCache
from graph_kvcache_mcp.plugins.vllm_kv.receive import BlockLoader
from graph_kvcache_mcp.plugins.vllm_kv.stats import EngineKVPromMetrics, EngineKVStats
from graph_kvcache_mcp.plugins.vllm_kv.store import (
    EngineBlockStore,
    drain_seconds,
    give_workers_time_to_drain,
    logger,
    reserved_cores,
)

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


@dataclass
class EngineKVMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's plan, pickled to every worker with the scheduler output."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
    hybrid_loads: list[HybridLoad] = field(default_factory=list)
    state_saves: list[StateTransfer] = field(default_factory=list)


class EngineKVConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """vLLM KV connector backed by the engine's `/kv/<key>` store."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.identity = model_identity(vllm_config, kv_cache_config)
        self.block_size = self.identity.block_size
        self.store = EngineBlockStore.from_environment(os.environ)
        self.planner = TransferPlanner(self.identity.digest, self.block_size)
        self._local_tokens: dict[str, int] = {}
        self._pages: PagedKvCache | None = None
        self._loader: BlockLoader | None = None
        self._load_errors: set[int] = set()
        # A hybrid (several KV cache groups): attention blocks plus Mamba states, loaded
        # asynchronously (vLLM can only fail whole requests of a multi-group model).
        self._layout: HybridLayout | None = None
        self._hybrid: HybridPlanner | None = None
        self._hybrid_pages: HybridPages | None = None
        self._loaded: set[str] = set()
        self._failed: set[str] = set()
        if len(kv_cache_config.kv_cache_groups) > 1:
            self._layout = hybrid_layout(kv_cache_config)
            self.state_identity = state_identity(self.identity, self._layout)
            self._hybrid = HybridPlanner(
                self.identity.digest,
                self.state_identity.digest,
                self.block_size,
                attention_group=self._layout.attention_group,
                state_groups=self._layout.state_groups,
            )
        if role == KVConnectorRole.SCHEDULER and (
            self._kv_transfer_config.kv_load_failure_policy != "recompute"
        ):
            # vLLM reads the policy right after building this connector. A block that vanished
            # or fails its checksum must cost a recompute, not fail the user's request.
            self._kv_transfer_config.kv_load_failure_policy = "recompute"
        if role == KVConnectorRole.SCHEDULER:
            give_workers_time_to_drain(os.environ, drain_seconds(os.environ))
            # One process (the scheduler's) tells the fleet view how this vLLM keys its blocks.
            self._publish_identity()
        logger.info(
            "EngineKVConnector (%s) ready: engine %s, identity %s (%s, %d layers, block %d "
            "tokens, %d bytes per block, layout %s)",
            role.name.lower(),
            self.store.client.base_url,
            self.identity.digest,
            self.identity.served_model,
            self.identity.num_layers,
            self.block_size,
            self.identity.block_bytes,
            self.identity.layout,
        )
        if self._layout is not None:
            logger.info(
                "EngineKVConnector: hybrid with KV cache groups %s: attention group %d, Mamba "
                "groups %s, state identity %s (%d bytes per state)",
                self.identity.kv_groups,
                self._layout.attention_group,
                list(self._layout.state_groups),
                self.state_identity.digest,
                self.state_identity.block_bytes,
            )

    def _publish_identity(self) -> None:
        """Write the identity record where the launch plan asked (best effort: logged)."""
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        path = extra.get(IDENTITY_FILE_KEY)
        if not path:
            return
        states = self.state_identity if self._layout is not None else None
        record = published_identity(self.identity, states)
        try:
            write_private(Path(str(path)), identity_file_json(record))
        except Exception:  # the fleet view then says "not checked"; serving goes on
            logger.exception("EngineKVConnector: could not write its identity to %s", path)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped save is a future miss, nothing more

    # --- scheduler side ----------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if not _eligible(request):
            return 0, False
        if self._hybrid is not None:
            return self._hybrid_hit(request, num_computed_tokens, self._hybrid)
        keys = self.planner.lookup_keys(
            request.request_id, request.all_token_ids, num_computed_tokens, request.cache_salt
        )
        self._local_tokens[request.request_id] = num_computed_tokens
        began = time.perf_counter()
        present = self.store.count_present(keys) if keys else 0
        if present:
            logger.info(
                "EngineKVConnector: found %d of %d blocks of request %s in the engine in %.4f s",
                present,
                len(keys),
                request.request_id,
                time.perf_counter() - began,
            )
        return present * self.block_size, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        local = self._local_tokens.pop(request.request_id, None)
        if local is None:
            return
        if self._hybrid is not None:
            self._hybrid.admitted(
                request.request_id, blocks.get_block_ids(), num_external_tokens, local
            )
            return
        block_ids = blocks.get_block_ids()[0]
        self.planner.admitted(request.request_id, block_ids, num_external_tokens, local)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        group = self._layout.attention_group if self._layout is not None else 0
        scheduled = [
            ScheduledRequest(
                req_id=new.req_id,
                num_computed_tokens=new.num_computed_tokens,
                num_scheduled_tokens=scheduler_output.num_scheduled_tokens.get(new.req_id, 0),
                new_block_ids=list(new.block_ids[group]),
                replaces_blocks=True,
            )
            for new in scheduler_output.scheduled_new_reqs
        ]
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            new_blocks = cached.new_block_ids[index]
            scheduled.append(
                ScheduledRequest(
                    req_id=req_id,
                    num_computed_tokens=cached.num_computed_tokens[index],
                    num_scheduled_tokens=scheduler_output.num_scheduled_tokens.get(req_id, 0),
                    new_block_ids=list(new_blocks[group]) if new_blocks is not None else None,
                    replaces_blocks=req_id in cached.resumed_req_ids,
                )
            )
        if self._hybrid is not None:
            block_state = getattr(scheduler_output, "kv_connector_block_state", None)
            hybrid = self._hybrid.plan_step(
                scheduled,
                offers=block_state.boundary_state_offloads if block_state is not None else {},
                preempted=sorted(scheduler_output.preempted_req_ids or ()),
                finished=sorted(scheduler_output.finished_req_ids),
            )
            return EngineKVMetadata(
                saves=hybrid.saves, hybrid_loads=hybrid.loads, state_saves=hybrid.state_saves
            )
        plan: StepPlan = self.planner.plan_step(
            scheduled,
            preempted=sorted(scheduler_output.preempted_req_ids or ()),
            finished=sorted(scheduler_output.finished_req_ids),
        )
        return EngineKVMetadata(loads=plan.loads, saves=plan.saves)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.planner.forget(request.request_id)
        if self._hybrid is not None:
            self._hybrid.forget(request.request_id)
        self._local_tokens.pop(request.request_id, None)
        return False, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        # Saves copy their blocks out in the step that filled them: nothing holds blocks here.
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._hybrid is not None:
            for req_id in connector_output.failed_recving or ():
                self._hybrid.load_failed(req_id)

    def _hybrid_hit(
        self, request: Request, local_tokens: int, hybrid: HybridPlanner
    ) -> tuple[int, bool]:
        """The longest run of stored attention blocks that ends on a stored Mamba state; loaded
        asynchronously (vLLM parks the request until the workers report it in)."""
        req_id = request.request_id
        keys = hybrid.lookup_keys(req_id, request.all_token_ids, local_tokens, request.cache_salt)
        self._local_tokens[req_id] = local_tokens
        began = time.perf_counter()
        present = self.store.count_present(keys) if keys else 0
        candidates = hybrid.state_candidates(req_id, local_tokens, present)
        found = self.store.first_present(candidates)
        blocks = 0 if found is None else present - found
        if present:
            logger.info(
                "EngineKVConnector: found %d of %d blocks of request %s in the engine, %d with "
                "a Mamba state at their end, in %.4f s",
                present,
                len(keys),
                req_id,
                blocks,
                time.perf_counter() - began,
            )
        return blocks * self.block_size, blocks > 0

    # --- worker side -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self._layout is not None:
            self._hybrid_pages = HybridPages(
                kv_caches, self._layout, self.store, self.identity, self.state_identity
            )
            self._after_register()
            return
        pages = PagedKvCache(kv_caches)
        if (len(pages.layers), pages.page_bytes) != (
            self.identity.num_layers,
            self.identity.page_bytes,
        ):
            raise ValueError(
                f"EngineKVConnector: vLLM registered {len(pages.layers)} KV layers of "
                f"{pages.page_bytes} bytes per page, but its KV cache config promised "
                f"{self.identity.num_layers} of {self.identity.page_bytes}; refusing to move "
                "blocks of a layout it does not understand"
            )
        self._pages = pages
        self._loader = BlockLoader(self.store, self.identity, pages.write_block)
        self._after_register()

    def _after_register(self) -> None:
        _allow_amx_tiles()
        # vLLM calls this on the worker's main thread, after binding it to the OpenMP cores.
        if cores := reserved_cores():
            self.store.run_uploads_on(cores)
            logger.info("EngineKVConnector: uploads run on the reserved cores %s", sorted(cores))

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self.store.step_started()  # vLLM binds before every forward step (worker side)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self.store.step_ended()

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        if not isinstance(metadata, EngineKVMetadata):
            return
        for load in metadata.loads:
            self._load(load)
        for hybrid in metadata.hybrid_loads:
            self._load_hybrid(hybrid)

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
        self.store.step_ended()
        metadata = self._get_connector_metadata()
        if not isinstance(metadata, EngineKVMetadata):
            return
        if self._hybrid_pages is not None:
            self._save_hybrid(metadata, self._hybrid_pages)
            return
        if not metadata.saves:
            return
        pages = self._require_pages()
        items: list[tuple[str, bytes]] = []
        try:
            # Only the copy out of the cache happens here, before vLLM may reuse the blocks; the
            # checksum and header are made on the upload thread.
            for save in metadata.saves:
                items += [
                    (key, b"".join(pages.page_views(block_id)))
                    for key, block_id in zip(save.keys, save.block_ids, strict=True)
                ]
        except Exception:  # a save is an optimisation: never fail the step for it
            logger.exception("EngineKVConnector: could not copy blocks out for saving")
            return
        self.store.save_later(items, self._encode)

    def _encode(self, key: str, payload: bytes) -> bytes:
        return encode_block(key, self.identity, payload)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Hybrid loads done in this step; a failed one is reported as such (vLLM recomputes
        the request) and as finished, which releases it from its wait."""
        loaded, self._loaded = self._loaded, set()
        failed, self._failed = self._failed, set()
        return KVConnectorTransferResults(finished_recving=loaded | failed, failed_recving=failed)

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

    # --- internals ---------------------------------------------------------------------------

    def _require_pages(self) -> PagedKvCache:
        if self._pages is None:
            raise RuntimeError("EngineKVConnector: vLLM never registered its KV caches")
        return self._pages

    def _require_loader(self) -> BlockLoader:
        if self._loader is None:
            raise RuntimeError("EngineKVConnector: vLLM never registered its KV caches")
        return self._loader

    def _save_hybrid(self, metadata: EngineKVMetadata, pages: HybridPages) -> None:
        if not (metadata.saves or metadata.state_saves):
            return
        try:
            blocks = pages.copy_blocks(metadata.saves)
            states = pages.copy_states(metadata.state_saves)
        except Exception:  # a save is an optimisation: never fail the step for it
            logger.exception("EngineKVConnector: could not copy blocks out for saving")
            return
        if blocks:
            self.store.save_later(blocks, self._encode)
        if states:
            self.store.save_later(states, self._encode_state)

    def _encode_state(self, key: str, payload: bytes) -> bytes:
        return encode_block(key, self.state_identity, payload)

    def _load_hybrid(self, load: HybridLoad) -> None:
        """All of a request's blocks and its state, or it fails as a whole (vLLM recomputes it)."""
        pages = self._hybrid_pages
        if pages is None:
            raise RuntimeError("EngineKVConnector: vLLM never registered its KV caches")
        began = time.perf_counter()
        try:
            loaded, read_bytes, failure = pages.load(load)
        except Exception as exc:  # never into vLLM: the request is recomputed
            loaded, read_bytes, failure = 0, 0, f"the load raised {type(exc).__name__}"
        took = time.perf_counter() - began
        if failure is not None:
            logger.warning(
                "EngineKVConnector: request %s not loaded (%s); vLLM recomputes it",
                load.req_id,
                failure,
            )
            self._failed.add(load.req_id)
            self.store.tally.add(load_failed_blocks=len(load.blocks.block_ids) + 1)
            return
        logger.info(
            "EngineKVConnector: loaded %d blocks and a Mamba state (%d bytes) for request %s "
            "in %.4f s",
            loaded - 1,
            read_bytes,
            load.req_id,
            took,
        )
        self._loaded.add(load.req_id)
        self.store.tally.add(loaded_blocks=loaded, loaded_bytes=read_bytes)

    def _load(self, load: BlockTransfer) -> None:
        """Load the longest good run of `load`'s blocks; report the rest for recompute."""
        loader = self._require_loader()
        began = time.perf_counter()
        result = loader.load(load.keys, load.block_ids)
        took = time.perf_counter() - began
        if result.failure is not None:
            logger.warning(
                "EngineKVConnector: block %s of request %s not loaded (%s); vLLM recomputes "
                "from there",
                *result.failure[:1],
                load.req_id,
                result.failure[1],
            )
        if result.loaded_blocks:
            logger.info(
                "EngineKVConnector: loaded %d blocks (%d bytes) for request %s in %.4f s",
                result.loaded_blocks,
                result.read_bytes,
                load.req_id,
                took,
            )
        failed = load.block_ids[result.loaded_blocks :]
        self._load_errors.update(failed)
        self.store.tally.add(
            loaded_blocks=result.loaded_blocks,
            loaded_bytes=result.read_bytes,
            load_failed_blocks=len(failed),
        )


def _allow_amx_tiles() -> None:
    """Ask Linux for AMX tile state for this worker process, where the CPU has AMX.

    vLLM's CPU attention runs AMX kernels for bf16 KV in 32-token blocks, and a process may only
    execute AMX instructions once it has asked for the tile state (arch_prctl XCOMP_PERM). vLLM
    relies on an earlier bf16 matmul having asked; with this connector the first forward pass of
    a fresh process can already attend over loaded context, and then died of SIGILL in
    `cpu_attention_with_kv_cache` (seen on restarts, intermittently). Asking twice is harmless.
    """
    if torch.cpu._is_amx_tile_supported() and not torch.cpu._init_amx():
        logger.warning("EngineKVConnector: the OS refused AMX tile state to this process")


def model_identity(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> KvModelIdentity:
    """What the stored blocks must match, read from vLLM's config.

    A hybrid's identity describes its attention group (what a block value holds) and names
    every group's kind and geometry (`kv_groups`), so its keys are never a dense model's.

    Raises:
        ValueError: a setup this connector does not handle (not the CPU KV cache, KV cache
            groups other than one full-attention group or a Mamba2 hybrid in align mode, tensor
            or pipeline parallelism).
    """
    from vllm import __version__ as vllm_version

    parallel = vllm_config.parallel_config
    groups = kv_cache_config.kv_cache_groups
    cache = vllm_config.cache_config
    kv_groups = ""
    attention_group = 0
    if len(groups) > 1:
        problem = unsupported_hybrid(
            device=str(vllm_config.device_config.device_type),
            tensor_parallel=parallel.tensor_parallel_size,
            pipeline_parallel=parallel.pipeline_parallel_size,
            group_kinds=[type(group.kv_cache_spec).__name__ for group in groups],
            sliding_window=any(
                getattr(group.kv_cache_spec, "sliding_window", None) for group in groups
            ),
            mamba_cache_mode=str(cache.mamba_cache_mode),
        )
        if problem is not None:
            raise ValueError(problem)
        layout_of_groups = hybrid_layout(kv_cache_config)
        kv_groups = layout_of_groups.description
        attention_group = layout_of_groups.attention_group
    spec: Any = groups[attention_group].kv_cache_spec if groups else None
    if not kv_groups:
        problem = unsupported_setup(
            device=str(vllm_config.device_config.device_type),
            tensor_parallel=parallel.tensor_parallel_size,
            pipeline_parallel=parallel.pipeline_parallel_size,
            kv_cache_groups=len(groups),
            spec_kind=type(spec).__name__,
            sliding_window=getattr(spec, "sliding_window", None),
        )
        if problem is not None:
            raise ValueError(problem)
    model = vllm_config.model_config
    served = model.served_model_name or model.model
    served_name = served[0] if isinstance(served, list) else served
    dtype = str(spec.dtype).removeprefix("torch.")
    layout = kv_cache_config.kv_cache_layout or "LBHNC"
    return KvModelIdentity(
        served_model=str(served_name),
        architecture=model.architecture,
        dtype=dtype,
        num_layers=len(groups[attention_group].layer_names),
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        head_size_v=spec.head_size_v or spec.head_size,
        block_size=spec.block_size,
        page_bytes=spec.page_size_bytes,
        layout=f"cpu:{layout}:{_cpu_attention_isa(spec, cache.cache_dtype)}:{cache.cache_dtype}",
        vllm_version=vllm_version,
        kv_groups=kv_groups,
    )


def _cpu_attention_isa(spec: Any, cache_dtype: str) -> str:
    """The CPU attention kernel's ISA: it decides how K is packed inside a page."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        return str(_get_attn_isa(spec.dtype, spec.block_size, spec.head_size, cache_dtype))
    except Exception as exc:  # a private vLLM function: name the failure, keep keys distinct
        return f"unknown-{type(exc).__name__}"


def _eligible(request: Request) -> bool:
    """Requests whose KV depends only on their token ids (no LoRA, images or embeddings)."""
    return not (
        request.lora_request is not None
        or request.mm_features
        or request.prompt_embeds is not None
        or request.skip_reading_prefix_cache
    )
