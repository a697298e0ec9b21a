"""`EngineKVConnector`'s worker side (vLLM's worker process): the loads and the saves.

Before the forward pass, reads the planned blocks, checks each value's header and checksum, and
writes them into the paged KV cache (`receive.BlockLoader`); after the pass (`wait_for_save`),
copies the newly full blocks out and queues them for upload (`uploads.UploadQueue`). A block that
fails to load is reported to vLLM, which recomputes it; a hybrid's request loads all or nothing.
A KV cache on a device (CUDA) moves through `device.mover` (a hybrid's through `device.hybrid`):
its saves finish after the step, so their requests are held until the copies are done
(`device.held`). With tensor parallelism each rank of a dense model holds its own heads of every
block and stores them under its own key (`rank_key` of the chain key the scheduler plans with).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

from graph_kvcache_mcp.domain.vllm.engine_kv.device import kernel_rows, rank_key
from graph_kvcache_mcp.domain.vllm.hybrid.kv_plan import HybridLoad
from graph_kvcache_mcp.domain.vllm.kv_plan import BlockTransfer
from graph_kvcache_mcp.plugins.vllm_kv.device.held import HeldSaves
from graph_kvcache_mcp.plugins.vllm_kv.device.hybrid import DeviceHybrid, hybrid_pages
from graph_kvcache_mcp.plugins.vllm_kv.device.mover import DeviceBlocks, encoder
from graph_kvcache_mcp.plugins.vllm_kv.device.pages import dense_pages
from graph_kvcache_mcp.plugins.vllm_kv.device.streams import (
    DONE,
    CopyStreams,
    Fence,
    streams_for,
)
from graph_kvcache_mcp.plugins.vllm_kv.engine_calls import logger
from graph_kvcache_mcp.plugins.vllm_kv.hybrid import HybridPages
from graph_kvcache_mcp.plugins.vllm_kv.identity import ConnectorSetup
from graph_kvcache_mcp.plugins.vllm_kv.metadata import EngineKVMetadata
from graph_kvcache_mcp.plugins.vllm_kv.pages import PagedKvCache
from graph_kvcache_mcp.plugins.vllm_kv.receive import BlockLoader
from graph_kvcache_mcp.plugins.vllm_kv.uploads import process_cores, reserved_cores

NOT_REGISTERED = "EngineKVConnector: vLLM never registered its KV caches"


class WorkerSide:
    """Moves blocks between one worker's KV cache and the engine."""

    def __init__(
        self, setup: ConnectorSetup, streams: CopyStreams | None = None, rank: int | None = None
    ) -> None:
        """`streams`: where a device cache's copies run (default: its device's own); given, the
        device path moves CPU tensors too (how tests run it without a GPU). `rank`: this
        worker's tensor-parallel rank (default: vLLM's, asked at registration; given, how tests
        run a rank other than 0 in one process)."""
        self.identity = identity = setup.identity
        self.states = states = setup.states
        self.store = setup.store
        self._layout = setup.layout
        self._num_blocks = setup.num_blocks
        self._streams = streams
        self._ranks = setup.tensor_parallel
        self._rank = rank
        self._device: DeviceBlocks | None = None
        self.held = HeldSaves()
        self._pages: PagedKvCache | None = None
        self._loader: BlockLoader | None = None
        self._hybrid_pages: HybridPages | DeviceHybrid | None = None
        self._load_errors: set[int] = set()
        self._loaded: set[str] = set()
        self._failed: set[str] = set()
        self._encode = encoder(identity, DONE)
        self._encode_state = encoder(states or identity, DONE)  # only a hybrid saves states

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._check_rank()
        first = next((t for t in kv_caches.values() if isinstance(t, torch.Tensor)), None)
        on_device = first is not None and (first.device.type != "cpu" or self._streams is not None)
        if self._layout is not None and self.states is not None:
            if on_device and first is not None:
                self._hybrid_pages = DeviceHybrid(
                    hybrid_pages(kv_caches, self._layout),
                    self._layout,
                    self._streams or streams_for(first.device),
                    self.store,
                    self.identity,
                    self.states,
                )
            else:
                self._hybrid_pages = HybridPages(
                    kv_caches, self._layout, self.store, self.identity, self.states
                )
            self._after_register()
            return
        if on_device and first is not None:
            self._register_device(kv_caches, self._streams or streams_for(first.device))
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
        self._loader = BlockLoader(self.store, self.identity, pages.write_block, pages.block_pages)
        self._after_register()

    def _check_rank(self) -> None:
        """Learn this worker's rank; its size must be the one the identity was made for.

        Raises:
            ValueError: vLLM runs another tensor-parallel size than its config promised.
        """
        rank, size = _tensor_parallel_rank() if self._rank is None else (self._rank, self._ranks)
        if size != self._ranks:
            raise ValueError(
                f"EngineKVConnector: this worker is rank {rank} of {size} tensor-parallel ranks, "
                f"but vLLM's config promised {self._ranks}; refusing to key blocks by rank"
            )
        rank_key("", rank=rank, size=size)  # raises for a rank outside 0..size-1
        self._rank = rank
        if size > 1:
            logger.info("EngineKVConnector: tensor-parallel rank %d of %d", rank, size)

    def _own_keys(self, keys: list[str]) -> list[str]:
        """This rank's keys of the scheduler's chain keys (the keys themselves for one rank)."""
        return [rank_key(key, rank=self._rank or 0, size=self._ranks) for key in keys]

    def _register_device(self, kv_caches: dict[str, torch.Tensor], streams: CopyStreams) -> None:
        pages = dense_pages(
            kv_caches,
            num_blocks=self._num_blocks,
            kernel_rows=kernel_rows(self.identity.layout, self.identity.block_size),
        )
        self._device = DeviceBlocks(pages, streams, self.store, self.identity)
        logger.info(
            "EngineKVConnector: KV cache on %s, %d layers, %d byte runs per block",
            pages.device,
            len(pages.layer_names),
            pages.runs_per_block,
        )

    def _after_register(self) -> None:
        _allow_amx_tiles()
        # vLLM calls this on the worker's main thread, after binding it to the OpenMP cores:
        # uploads go to the cores it reserved, loads (the forward pass waits for them) may use
        # every core of the process.
        if cores := reserved_cores():
            self.store.uploads.run_uploads_on(cores)
            self.store.run_loads_on(process_cores())
            logger.info(
                "EngineKVConnector: uploads run on the reserved cores %s, loads on cores %s",
                sorted(cores),
                sorted(process_cores()),
            )

    # --- loads -------------------------------------------------------------------------------

    def start_loads(self, metadata: EngineKVMetadata) -> None:
        for load in metadata.loads:
            self._load(load)
        for hybrid in metadata.hybrid_loads:
            self._load_hybrid(hybrid)

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def take_transfer_results(self, finished: Iterable[str] = ()) -> KVConnectorTransferResults:
        """Hybrid loads done in this step; a failed one is reported as such (vLLM recomputes
        the request) and as finished, which releases it from its wait. Of the `finished`
        requests, those held for async saves, once their copies are done."""
        loaded, self._loaded = self._loaded, set()
        failed, self._failed = self._failed, set()
        return KVConnectorTransferResults(
            finished_sending=self.held.release(finished),
            finished_recving=loaded | failed,
            failed_recving=failed,
        )

    def wait_for_copies(self) -> None:
        """Every queued copy out is done: vLLM is about to reuse preempted requests' blocks."""
        self.held.wait_all()

    def _load(self, load: BlockTransfer) -> None:
        """Load the longest good run of `load`'s blocks; report the rest for recompute."""
        began = time.perf_counter()
        keys = self._own_keys(load.keys)
        if self._device is not None:
            result = self._device.load(keys, load.block_ids)
        elif self._loader is not None:
            result = self._loader.load(keys, load.block_ids)
        else:
            raise RuntimeError(NOT_REGISTERED)
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

    def _load_hybrid(self, load: HybridLoad) -> None:
        """All of a request's blocks and its state, or it fails as a whole (vLLM recomputes it)."""
        pages = self._hybrid_pages
        if pages is None:
            raise RuntimeError(NOT_REGISTERED)
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

    # --- saves -------------------------------------------------------------------------------

    def save(self, metadata: EngineKVMetadata) -> None:
        """Copy this step's newly full blocks out of the cache and queue them for upload."""
        if self._hybrid_pages is not None:
            self._save_hybrid(metadata, self._hybrid_pages)
            return
        if not metadata.saves:
            return
        if self._device is not None:
            self._save_device(metadata, self._device)
            return
        if self._pages is None:
            raise RuntimeError(NOT_REGISTERED)
        pages = self._pages
        items: list[tuple[str, bytes]] = []
        try:
            # Only the copy out of the cache happens here, before vLLM may reuse the blocks; the
            # checksum and header are made on the upload thread.
            for save in metadata.saves:
                items += [
                    (key, b"".join(pages.page_views(block_id)))
                    for key, block_id in zip(self._own_keys(save.keys), save.block_ids, strict=True)
                ]
        except Exception:  # a save is an optimisation: never fail the step for it
            logger.exception("EngineKVConnector: could not copy blocks out for saving")
            return
        self.store.save_later(items, self._encode)

    def _save_device(self, metadata: EngineKVMetadata, device: DeviceBlocks) -> None:
        """Queue one copy of the step's blocks on the save stream; the upload waits for it."""
        keys = self._own_keys([key for save in metadata.saves for key in save.keys])
        block_ids = [block_id for save in metadata.saves for block_id in save.block_ids]
        fence: Fence = DONE
        try:
            items, fence = device.copy_out(keys, block_ids)
        except Exception:  # a save is an optimisation: never fail the step for it
            logger.exception("EngineKVConnector: could not copy blocks out for saving")
            items = []
        for save in metadata.saves:  # held either way: the scheduler holds every saved request
            self.held.saving(save.req_id, fence)
        if items:
            self.store.save_later(items, encoder(self.identity, fence))

    def _save_hybrid(self, metadata: EngineKVMetadata, pages: HybridPages | DeviceHybrid) -> None:
        if not (metadata.saves or metadata.state_saves):
            return
        if isinstance(pages, DeviceHybrid):
            self._save_device_hybrid(metadata, pages)
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

    def _save_device_hybrid(self, metadata: EngineKVMetadata, pages: DeviceHybrid) -> None:
        """One save-stream copy of the step's blocks and states; the uploads wait for it."""
        fence: Fence = DONE
        try:
            blocks, states, fence = pages.copy_out(metadata.saves, metadata.state_saves)
        except Exception:  # a save is an optimisation: never fail the step for it
            logger.exception("EngineKVConnector: could not copy blocks out for saving")
            blocks, states = [], []
        saved = [save.req_id for save in metadata.saves]
        for req_id in saved + [state.req_id for state in metadata.state_saves]:
            self.held.saving(req_id, fence)  # held either way: the scheduler holds them all
        if blocks:
            self.store.save_later(blocks, encoder(self.identity, fence))
        if states:
            self.store.save_later(states, encoder(pages.state_identity, fence))


def _tensor_parallel_rank() -> tuple[int, int]:
    """This worker's tensor-parallel rank and size, from vLLM's parallel state; (0, 1) where
    vLLM has not set it up (a single process: one rank)."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, 1
    return (
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_world_size(),
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
