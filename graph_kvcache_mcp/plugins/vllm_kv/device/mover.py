"""A dense model's blocks moved between a device KV cache and the engine, ordered by events.

Save (`copy_out`, in `wait_for_save`): a fence on the compute stream after the step's writes;
the save stream waits on it, gathers the blocks and copies them (non-blocking) into pinned host
memory; the fence of that copy travels with the queued blocks, and the upload thread waits on it
before it reads them (`encoder`). The request stays held until the copy is done (`held`).

Load (`load`, in `start_load_kv`): a fence on the compute stream (work of earlier steps may still
use the blocks); each block a lane received into a pinned slot is copied in on the load stream
after it, and the lane waits for its copy before the slot is reused. The write window settles the
load stream before it closes, and the compute stream waits for the load stream's tail before
`start_load_kv` returns, so the forward pass reads loaded blocks only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity, encode_block
from graph_kvcache_mcp.plugins.vllm_kv.device.pages import DevicePages
from graph_kvcache_mcp.plugins.vllm_kv.device.slots import host_buffer, host_slot_pool
from graph_kvcache_mcp.plugins.vllm_kv.device.streams import DONE, CopyStreams, Fence
from graph_kvcache_mcp.plugins.vllm_kv.receive import BlockLoader, LoadResult, WriteBlock
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from graph_kvcache_mcp.plugins.vllm_kv.uploads import Payload


class DeviceBlocks:
    """One worker's dense KV cache on a device, and the streams its copies run on."""

    def __init__(
        self,
        pages: DevicePages,
        streams: CopyStreams,
        store: EngineBlockStore,
        identity: KvModelIdentity,
    ) -> None:
        """Raises:
        ValueError: the pages do not hold blocks of `identity`'s size.
        """
        self.pages = pages
        self.streams = streams
        self.identity = identity
        self.layers = pages.layer_names
        pages.check_values("KV", self.layers, identity)
        self.loader = device_loader(store, identity, self.write_block, pages, streams)
        self._after: Fence = DONE

    # --- saves -------------------------------------------------------------------------------

    def copy_out(
        self, keys: Sequence[str], block_ids: Sequence[int]
    ) -> tuple[list[tuple[str, Payload]], Fence]:
        """Queue the copy of `block_ids` into pinned host memory: (key, its block's bytes once
        the fence is done) per block, and that fence."""
        self.pages.check_blocks(block_ids)  # here, not in the queued copy: a bad plan raises now
        after = self.streams.record_compute()
        host = host_buffer((len(block_ids), self.identity.block_bytes), self.pages.device)
        per_layer = [[block_id] * len(self.layers) for block_id in block_ids]

        def copy() -> None:
            host.copy_(self.pages.gather(self.layers, per_layer), non_blocking=True)

        done = self.streams.on_save_stream(after, copy)
        rows = host.numpy()  # views the pinned rows; read only once `done` is
        return [(key, memoryview(rows[i])) for i, key in enumerate(keys)], done

    # --- loads -------------------------------------------------------------------------------

    def load(self, keys: Sequence[str], block_ids: Sequence[int]) -> LoadResult:
        """`BlockLoader.load` into the device cache; the compute stream then waits for it."""
        self._after = self.streams.record_compute()
        try:
            return self.loader.load(keys, block_ids)
        finally:
            self.streams.compute_waits(self.streams.on_load_stream(DONE, _nothing))

    def write_block(self, block_id: int, data: memoryview) -> None:
        """A lane's delivery of one received block (`data` is its pinned slot)."""
        slot = torch.frombuffer(data, dtype=torch.uint8).view(1, -1)

        def copy() -> None:
            rows = slot.to(self.pages.device, non_blocking=True)
            self.pages.scatter(rows, self.layers, [[block_id] * len(self.layers)])

        # The slot goes back to the pool when this returns: its copy must have read it by then.
        self.streams.on_load_stream(self._after, copy).synchronize()


def device_loader(
    store: EngineBlockStore,
    identity: KvModelIdentity,
    write_block: WriteBlock,
    pages: DevicePages,
    streams: CopyStreams,
) -> BlockLoader:
    """A loader of `identity`'s values into a device cache: received into slots a copy to the
    device reads directly, its queued copies settled before its load's window closes."""
    return BlockLoader(
        store,
        identity,
        write_block,
        slots=host_slot_pool(identity.block_bytes, pages.device),
        settle=streams.synchronize_loads,
    )


def encoder(identity: KvModelIdentity, fence: Fence) -> Callable[[str, Payload], bytes]:
    """The upload thread's encoding of blocks `copy_out` queued: after their copy is done."""

    def encode(key: str, payload: Payload) -> bytes:
        fence.synchronize()
        return encode_block(key, identity, [payload])

    return encode


def _nothing() -> None:
    return
