"""Pages of a hybrid model's KV cache, addressed in vLLM's one backing allocation (torch, no vLLM).

A hybrid's KV cache groups overlay one byte buffer: vLLM's `KVCacheConfig.kv_cache_tensors` place
layer `l` of a tensor, block `b`, at `offset + l * layer_stride + b * block_stride`. Attention
layers get `[B, H, N, C]` views of it; Mamba layers get the raw buffer and lay out their conv and
SSM states in each page themselves. So pages are read and written here as opaque bytes at those
placements, whatever a layer's tensor looks like: a block's value is its pages, in a fixed order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a layer's pages start in the backing allocation, their stride and size (bytes)."""

    offset: int
    block_stride: int
    page_bytes: int


class RawPages:
    """Byte views `[num_blocks, page_bytes]` of each placed layer over vLLM's KV allocation."""

    def __init__(
        self, caches: Mapping[str, Any], placements: Mapping[str, Placement], num_blocks: int
    ) -> None:
        """Take vLLM's `register_kv_caches` dict and each layer's placement.

        Raises:
            ValueError: the caches are not on the CPU, or a layer lies outside the allocation.
        """
        tensor = next((t for t in caches.values() if isinstance(t, torch.Tensor)), None)
        if tensor is None or tensor.device.type != "cpu":
            raise ValueError("vLLM registered no CPU KV cache tensor")
        self._tensor = tensor  # keeps the allocation alive
        storage = tensor.untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        self._arrays: dict[str, np.ndarray] = {}
        for name, place in placements.items():
            end = place.offset + (num_blocks - 1) * place.block_stride + place.page_bytes
            if place.offset < 0 or end > flat.nbytes:
                raise ValueError(
                    f"KV cache layer {name} would end at byte {end} of a {flat.nbytes}-byte "
                    "allocation; refusing to move pages of a layout it does not understand"
                )
            self._arrays[name] = np.lib.stride_tricks.as_strided(
                flat[place.offset :],
                shape=(num_blocks, place.page_bytes),
                strides=(place.block_stride, 1),
            )
            check_view(name, caches.get(name), storage.data_ptr() + place.offset)

    def read(self, layers: Sequence[str], block_ids: Sequence[int]) -> bytes:
        """The pages of `layers[i]` at `block_ids[i]`, joined in one copy."""
        return b"".join(
            memoryview(self._arrays[name][block_id])
            for name, block_id in zip(layers, block_ids, strict=True)
        )

    def views(self, layers: Sequence[str], block_id: int) -> list[memoryview]:
        """Writable byte views of block `block_id`'s page in each of `layers`, in order."""
        return [memoryview(self._arrays[name][block_id]) for name in layers]

    def write(
        self, layers: Sequence[str], block_ids: Sequence[Sequence[int]], payload: memoryview
    ) -> None:
        """Copy `payload` (the pages of `layers`, in order) into each of `block_ids[i]` of
        `layers[i]`. Releases the GIL while it copies."""
        data = np.frombuffer(payload, dtype=np.uint8)
        at = 0
        for name, targets in zip(layers, block_ids, strict=True):
            array = self._arrays[name]
            page = data[at : at + array.shape[1]]
            if page.nbytes != array.shape[1]:
                raise ValueError(f"payload of {data.nbytes} bytes ends inside layer {name}")
            for block_id in targets:
                array[block_id] = page
            at += array.shape[1]
        if at != data.nbytes:
            raise ValueError(f"payload of {data.nbytes} bytes is not the {at} bytes of its pages")


def check_view(name: str, cache: Any, page_zero: int) -> None:
    """A layer's own view (attention layers have one) must start where its placement says.

    Raises:
        ValueError: it does not: the placement arithmetic does not match this vLLM.
    """
    if isinstance(cache, torch.Tensor) and cache.dim() == 4 and cache.data_ptr() != page_zero:
        raise ValueError(
            f"KV cache layer {name}'s view starts {cache.data_ptr() - page_zero} bytes from "
            "where vLLM's KV cache config places it; refusing to move its pages"
        )
