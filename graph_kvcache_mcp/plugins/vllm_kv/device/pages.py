"""Whole KV blocks gathered from, and scattered into, a KV cache on any torch device.

A GPU attention layer's registered view is logical (`[2, blocks, tokens, heads, dim]` for
FlashAttention, permuted by vLLM's `KVCacheLayout`, so not `is_contiguous()`), and a backend may
split vLLM's block into `kernel_rows` smaller kernel blocks, each its own row of the view. So
pages are addressed as bytes of the allocation under the view: `view_placements` reads, from the
view's strides, where each vLLM block's bytes lie (one run per block for a block-major page; one
per K and V half for FlashAttention's K/V-outer views). A block's value is those runs, layer by
layer in a fixed order, exactly as memory holds them: on CPU, the bytes `pages.PagedKvCache` and
`raw_pages.RawPages` move. Torch only (no `.numpy()`, which a CUDA tensor refuses).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity
from graph_kvcache_mcp.plugins.vllm_kv.raw_pages import Placement

Layer = tuple[Any, Sequence[Placement]]
"""A tensor of the layer's allocation (its storage is what is addressed) and where its pages lie."""


def view_placements(
    name: str, view: torch.Tensor, *, num_blocks: int, kernel_rows: int
) -> list[Placement]:
    """Where a block's bytes of the layer `view` lie, as offsets into the view's storage.

    The view's block dimension is its first of `num_blocks * kernel_rows` rows; the dimensions
    before it (FlashAttention's K/V) each make a separate placement; those after it must fill
    their row densely, in any order (vLLM's layouts permute, never pad, inside a row).

    Raises:
        ValueError: the view has no such dimension or its rows are not dense: a layout this
            connector does not understand, refused rather than moved wrongly.
    """
    rows = num_blocks * kernel_rows
    block_dim = next((dim for dim, size in enumerate(view.shape) if size == rows), None)
    if block_dim is None:
        raise ValueError(
            f"KV cache layer {name} ({tuple(view.shape)}) has no dimension of {num_blocks} blocks "
            f"x {kernel_rows} kernel rows; refusing to move pages of a layout it does not "
            "understand"
        )
    inner = sorted(
        (stride, size)
        for stride, size in zip(
            view.stride()[block_dim + 1 :], view.shape[block_dim + 1 :], strict=True
        )
        if size != 1
    )
    dense = 1
    for stride, size in inner:
        if stride != dense:
            raise ValueError(
                f"KV cache layer {name}'s rows are not dense (strides {view.stride()}, shape "
                f"{tuple(view.shape)}); refusing to move its pages"
            )
        dense *= size
    item = view.element_size()
    row = math.prod(view.shape[block_dim + 1 :])
    row_stride = view.stride(block_dim)
    block_stride = kernel_rows * row_stride * item
    outer = [range(size) for size in view.shape[:block_dim]]
    placements = []
    for index in itertools.product(*outer):
        start = view.storage_offset() + sum(
            i * stride for i, stride in zip(index, view.stride(), strict=False)
        )
        if row_stride == row:  # the block's kernel rows follow each other: one run of bytes
            placements.append(Placement(start * item, block_stride, kernel_rows * row * item))
            continue
        placements += [  # other layers' pages lie between kernel rows: a run per row
            Placement((start + j * row_stride) * item, block_stride, row * item)
            for j in range(kernel_rows)
        ]
    return placements


class DevicePages:
    """Byte views `[num_blocks, page_bytes]` of every placement of every layer, on its device."""

    def __init__(self, layers: Mapping[str, Layer], num_blocks: int) -> None:
        """Take each layer's tensor and placements (in the order a block's value holds them).

        Raises:
            ValueError: no layers, layers on several devices, or a page outside its allocation.
        """
        if not layers:
            raise ValueError("vLLM registered no KV cache layers")
        devices = {tensor.device for tensor, _ in layers.values()}
        if len(devices) != 1:
            raise ValueError(f"KV cache layers lie on several devices: {sorted(map(str, devices))}")
        self.device: torch.device = devices.pop()
        self.num_blocks = num_blocks
        self._parts: dict[str, list[torch.Tensor]] = {}
        for name, (tensor, placements) in layers.items():
            flat = torch.empty(0, dtype=torch.uint8, device=self.device)
            flat.set_(tensor.untyped_storage())
            self._parts[name] = [self._part(name, flat, place) for place in placements]

    def _part(self, name: str, flat: torch.Tensor, place: Placement) -> torch.Tensor:
        end = place.offset + (self.num_blocks - 1) * place.block_stride + place.page_bytes
        if place.offset < 0 or end > flat.numel() or place.block_stride < place.page_bytes:
            raise ValueError(
                f"KV cache layer {name}'s pages ({place}) do not lie apart inside its "
                f"{flat.numel()}-byte allocation; refusing to move them"
            )
        return flat.as_strided(
            (self.num_blocks, place.page_bytes), (place.block_stride, 1), place.offset
        )

    @property
    def layer_names(self) -> list[str]:
        return list(self._parts)

    @property
    def runs_per_block(self) -> int:
        """Separate runs of bytes a block spans (a layer each, more where K/V or rows split)."""
        return sum(len(parts) for parts in self._parts.values())

    def value_bytes(self, layers: Sequence[str]) -> int:
        """Bytes of one value holding the pages of `layers`."""
        return sum(int(part.shape[1]) for name in layers for part in self._parts[name])

    def check_values(self, what: str, layers: Sequence[str], promised: KvModelIdentity) -> None:
        """A value holding the pages of `layers` must be what `promised` describes.

        Raises:
            ValueError: the layer count or bytes per value differ (a layout not understood).
        """
        width = self.value_bytes(layers)
        if (len(layers), width) != (promised.num_layers, promised.block_bytes):
            raise ValueError(
                f"EngineKVConnector: the KV cache places {len(layers)} {what} layers of "
                f"{width} bytes per value, but the identity promised {promised.num_layers} "
                f"of {promised.block_bytes}; refusing to move pages of a layout it does not "
                "understand"
            )

    def gather(self, layers: Sequence[str], block_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """`[len(block_ids), value_bytes]` on the pages' device: row i holds, layer by layer,
        the pages of `layers[j]` at block `block_ids[i][j]`. Runs on the current stream."""
        columns = []
        for j, name in enumerate(layers):
            index = self._index([ids[j] for ids in block_ids])
            columns += [part.index_select(0, index) for part in self._parts[name]]
        return torch.cat(columns, dim=1)

    def scatter(
        self, rows: torch.Tensor, layers: Sequence[str], block_ids: Sequence[Sequence[int]]
    ) -> None:
        """Write `rows` (as `gather` returns them, on the pages' device) into their blocks.
        Runs on the current stream.

        Raises:
            ValueError: the rows are not one value of `layers`' pages per block.
        """
        width = self.value_bytes(layers)
        if tuple(rows.shape) != (len(block_ids), width):
            raise ValueError(f"rows {tuple(rows.shape)} are not {len(block_ids)} values of {width}")
        at = 0
        for j, name in enumerate(layers):
            index = self._index([ids[j] for ids in block_ids])
            for part in self._parts[name]:
                size = int(part.shape[1])
                part.index_copy_(0, index, rows[:, at : at + size])
                at += size

    def check_blocks(self, block_ids: Sequence[int]) -> None:
        """Raises:
        ValueError: a block id is not one of the cache's.
        """
        if any(not 0 <= block < self.num_blocks for block in block_ids):
            raise ValueError(f"a block id of {list(block_ids)} is not in 0..{self.num_blocks - 1}")

    def _index(self, block_ids: Sequence[int]) -> torch.Tensor:
        self.check_blocks(block_ids)
        return torch.tensor(list(block_ids), dtype=torch.long).to(self.device, non_blocking=True)


def dense_pages(
    caches: Mapping[str, torch.Tensor], *, num_blocks: int, kernel_rows: int
) -> DevicePages:
    """A dense model's pages: every registered layer, in name order (`pages.PagedKvCache`'s)."""
    return DevicePages(
        {
            name: (
                caches[name],
                view_placements(name, caches[name], num_blocks=num_blocks, kernel_rows=kernel_rows),
            )
            for name in sorted(caches)
        },
        num_blocks,
    )
