"""Copy whole KV blocks out of, and into, vLLM's paged KV cache on the CPU (torch, no vLLM).

vLLM's CPU backend keeps one `[num_blocks, kv_heads, block_size, head_size + head_size_v]` view
per attention layer, and inside a block the K half is stored transposed (or prepacked, by ISA):
positions in the view are not token positions. So blocks move as opaque bytes, all layers of a
block together, in a fixed layer order; the stored value's header names the layout they belong to.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch


class PagedKvCache:
    """The registered per-layer KV views of one worker, in a fixed layer order."""

    def __init__(self, caches: Mapping[str, torch.Tensor]) -> None:
        """Take vLLM's `register_kv_caches` dict.

        Raises:
            ValueError: the caches are not on the CPU or do not share one page shape and dtype.
        """
        if not caches:
            raise ValueError("vLLM registered no KV cache layers")
        self.layer_names = sorted(caches)
        self.layers = [caches[name] for name in self.layer_names]
        first = self.layers[0]
        for name, layer in zip(self.layer_names, self.layers, strict=True):
            if layer.device.type != "cpu":
                raise ValueError(
                    f"KV cache layer {name} lives on {layer.device}; this connector moves blocks "
                    "of vLLM's CPU KV cache only"
                )
            if layer.dim() != 4 or layer.shape[1:] != first.shape[1:] or layer.dtype != first.dtype:
                raise ValueError(
                    f"KV cache layer {name} has shape {tuple(layer.shape)} {layer.dtype}; every "
                    f"layer must be [blocks, heads, tokens, dim] like {tuple(first.shape)} "
                    f"{first.dtype}"
                )
        self.page_shape = tuple(int(n) for n in first.shape[1:])
        self.dtype = first.dtype
        self.page_bytes = int(first[0].numel() * first.element_size())
        # Byte views [blocks, page_bytes] of each layer, when every layer is one dense array.
        self._arrays: list[np.ndarray] | None = (
            [layer.view(torch.uint8).view(layer.shape[0], -1).numpy() for layer in self.layers]
            if all(layer.is_contiguous() for layer in self.layers)
            else None
        )

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * len(self.layers)

    def page_views(self, block_id: int) -> list[memoryview]:
        """Zero-copy views of one block's page in every layer, in layer order.

        They alias the KV cache: consume them (e.g. `encode_block`, which copies once) before
        vLLM may reuse the block.
        """
        return [
            memoryview(layer[block_id].contiguous().view(torch.uint8).numpy())
            for layer in self.layers
        ]

    def block_pages(self, block_id: int) -> list[memoryview] | None:
        """Writable byte views of one block's page in every layer, in layer order (the payload's
        order), for receiving a block in place; None when a layer is strided (no byte view)."""
        if self._arrays is None:
            return None
        return [memoryview(array[block_id]) for array in self._arrays]

    def write_block(self, block_id: int, data: memoryview) -> None:
        """Copy one block's payload (every layer's page, layer-major, as `page_views` reads
        them) into that block of every layer. Releases the GIL while it copies."""
        if data.nbytes != self.block_bytes:
            raise ValueError(f"{data.nbytes} bytes do not fill a block of {self.block_bytes}")
        payload = np.frombuffer(data, dtype=np.uint8)
        size = self.page_bytes
        if self._arrays is not None:
            for position, array in enumerate(self._arrays):
                array[block_id] = payload[position * size : (position + 1) * size]
            return
        for position, layer in enumerate(self.layers):  # a strided layer: torch copies it
            page = torch.from_numpy(payload[position * size : (position + 1) * size])
            layer[block_id].copy_(page.view(self.dtype).view(self.page_shape))
