"""Host memory that the device copies from and into: pinned (page-locked) on CUDA.

A copy between the GPU and pageable memory goes through a driver bounce buffer and blocks the
calling thread; from pinned memory it is one DMA that runs beside the model's kernels. So the
receive slots a load's lanes fill, and the buffers a save's copy lands in, are pinned on CUDA
and plain on CPU (where a "device" copy is a memcpy either way).
"""

from __future__ import annotations

from typing import Any

import torch

from graph_kvcache_mcp.connectors.engine.buffer_sink import SlotPool


def host_buffer(shape: tuple[int, ...], device: Any) -> torch.Tensor:
    """An uninitialised uint8 host tensor, pinned when `device` is a CUDA device."""
    return torch.empty(shape, dtype=torch.uint8, pin_memory=device.type == "cuda")


def host_slot_pool(slot_bytes: int, device: Any) -> SlotPool:
    """Receive slots of `slot_bytes` in host memory a copy to `device` reads directly."""

    def allocate(size: int) -> memoryview:
        # The memoryview keeps its numpy array, and that its tensor (the pinned block), alive.
        return memoryview(host_buffer((size,), device).numpy())

    return SlotPool(slot_bytes, allocate=allocate)
