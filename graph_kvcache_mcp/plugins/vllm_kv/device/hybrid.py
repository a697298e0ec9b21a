"""A hybrid model's (Mamba2 + attention) blocks and states moved between a device KV cache and
the engine, ordered by events: the device twin of `plugins.vllm_kv.hybrid.HybridPages`.

The pages are `HybridLayout`'s placements in vLLM's KV allocation, moved as opaque bytes through
`DevicePages` (one run per layer and block: a hybrid's page is its own block of the allocation,
whatever the attention view or the Mamba layers make of it), so a value holds exactly the bytes
`HybridPages` moves on CPU. Saves and loads are ordered as `mover.DeviceBlocks` orders a dense
model's: one save-stream copy per step into pinned host memory, held requests until it is done;
each received value copied in from its pinned slot on the load stream, settled before the write
window closes, and the compute stream waits for the loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from graph_kvcache_mcp.domain.vllm.hybrid.kv_plan import HybridLoad, StateTransfer
from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity
from graph_kvcache_mcp.domain.vllm.kv_plan import BlockTransfer
from graph_kvcache_mcp.plugins.vllm_kv.device.mover import device_loader
from graph_kvcache_mcp.plugins.vllm_kv.device.pages import DevicePages
from graph_kvcache_mcp.plugins.vllm_kv.device.slots import host_buffer
from graph_kvcache_mcp.plugins.vllm_kv.device.streams import DONE, CopyStreams, Fence
from graph_kvcache_mcp.plugins.vllm_kv.hybrid import HybridLayout, load_all, per_state_layer
from graph_kvcache_mcp.plugins.vllm_kv.raw_pages import check_view
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from graph_kvcache_mcp.plugins.vllm_kv.uploads import Payload

Items = list[tuple[str, Payload]]


def hybrid_pages(caches: Mapping[str, Any], layout: HybridLayout) -> DevicePages:
    """The placed pages of a hybrid's one KV allocation, on the device that holds it.

    Raises:
        ValueError: vLLM registered a layer the config does not place, no tensor, tensors of
            several allocations (the placements address one), or a view not where it is placed.
    """
    if missing := sorted(set(caches) - set(layout.placements)):
        raise ValueError(
            "EngineKVConnector: vLLM registered KV cache layers that its KV cache config "
            f"does not place: {', '.join(missing)}"
        )
    tensors = [
        tensor
        for value in caches.values()
        for tensor in (value if isinstance(value, list | tuple) else [value])
        if isinstance(tensor, torch.Tensor)
    ]
    if not tensors:
        raise ValueError("vLLM registered no KV cache tensor")
    allocation = tensors[0]
    base = allocation.untyped_storage().data_ptr()
    if any(tensor.untyped_storage().data_ptr() != base for tensor in tensors):
        raise ValueError(
            "EngineKVConnector: a hybrid's KV cache layers lie in several allocations, but its "
            "KV cache config places them in one; refusing to move pages of a layout it does not "
            "understand"
        )
    for name, place in layout.placements.items():
        check_view(name, caches.get(name), base + place.offset)
    return DevicePages(
        {name: (allocation, [place]) for name, place in layout.placements.items()},
        layout.num_blocks,
    )


class DeviceHybrid:
    """One worker's hybrid KV cache on a device, and the streams its copies run on."""

    def __init__(
        self,
        pages: DevicePages,
        layout: HybridLayout,
        streams: CopyStreams,
        store: EngineBlockStore,
        identity: KvModelIdentity,
        states: KvModelIdentity,
    ) -> None:
        """Raises:
        ValueError: the attention or state pages are not the sizes the identities promise.
        """
        self.pages = pages
        self.layout = layout
        self.streams = streams
        self.store = store
        self.identity = identity
        self.state_identity = states
        pages.check_values("attention", layout.attention_layers, identity)
        pages.check_values("Mamba state", layout.flat_state_layers, states)
        self.blocks = device_loader(store, identity, self.write_block, pages, streams)
        self.states = device_loader(store, states, self.write_state, pages, streams)
        self._after: Fence = DONE
        self._state_targets: list[tuple[tuple[int, ...], ...]] = []

    # --- saves -------------------------------------------------------------------------------

    def copy_out(
        self, saves: Sequence[BlockTransfer], states: Sequence[StateTransfer]
    ) -> tuple[Items, Items, Fence]:
        """Queue one copy of the step's blocks and states into pinned host memory: (key, bytes
        once the fence is done) per block and per state, and that fence."""
        attention = self.layout.attention_layers
        keys = [key for save in saves for key in save.keys]
        block_rows = [[block] * len(attention) for save in saves for block in save.block_ids]
        state_rows = [
            [blocks[0] for blocks in per_state_layer(self.layout, state.block_ids)]
            for state in states
        ]
        for rows in (*block_rows, *state_rows):  # here, not in the queued copy: a bad plan raises
            self.pages.check_blocks(rows)
        after = self.streams.record_compute()
        device = self.pages.device
        block_host = host_buffer((len(block_rows), self.identity.block_bytes), device)
        state_host = host_buffer((len(state_rows), self.state_identity.block_bytes), device)

        def copy() -> None:
            if block_rows:
                block_host.copy_(self.pages.gather(attention, block_rows), non_blocking=True)
            if state_rows:
                gathered = self.pages.gather(self.layout.flat_state_layers, state_rows)
                state_host.copy_(gathered, non_blocking=True)

        done = self.streams.on_save_stream(after, copy)
        block_values = block_host.numpy()  # views the pinned rows; read only once `done` is
        state_values = state_host.numpy()
        return (
            [(key, memoryview(block_values[i])) for i, key in enumerate(keys)],
            [(state.key, memoryview(state_values[i])) for i, state in enumerate(states)],
            done,
        )

    # --- loads -------------------------------------------------------------------------------

    def load(self, load: HybridLoad) -> tuple[int, int, str | None]:
        """`hybrid.load_all` into the device cache; the compute stream then waits for it."""
        self._state_targets = [load.state.block_ids]
        self._after = self.streams.record_compute()
        try:
            return load_all(self.store, self.blocks, self.states, load)
        finally:
            self.streams.compute_waits(self.streams.on_load_stream(DONE, _nothing))

    def write_block(self, block_id: int, data: memoryview) -> None:
        """A lane's delivery of one received attention block (`data` is its pinned slot)."""
        layers = self.layout.attention_layers
        self._copy_in(data, layers, [[block_id] * len(layers)])

    def write_state(self, index: int, data: memoryview) -> None:
        """A lane's delivery of a state: every Mamba layer's page, into each of its blocks."""
        targets = per_state_layer(self.layout, self._state_targets[index])
        rows = max(len(blocks) for blocks in targets)
        # A group with fewer target blocks repeats its last: the same bytes written twice.
        block_ids = [[blocks[min(r, len(blocks) - 1)] for blocks in targets] for r in range(rows)]
        self._copy_in(data, self.layout.flat_state_layers, block_ids)

    def _copy_in(
        self, data: memoryview, layers: Sequence[str], block_ids: Sequence[Sequence[int]]
    ) -> None:
        slot = torch.frombuffer(data, dtype=torch.uint8).view(1, -1)

        def copy() -> None:
            rows = slot.to(self.pages.device, non_blocking=True).expand(len(block_ids), -1)
            self.pages.scatter(rows, layers, block_ids)

        # The slot goes back to the pool when this returns: its copy must have read it by then.
        self.streams.on_load_stream(self._after, copy).synchronize()


def _nothing() -> None:
    return
