"""What about a vLLM's device and attention kernel decides the bytes of a stored KV page, as the
`layout` field of the connector's model identity, and each tensor-parallel rank's own keys. Pure.

Two vLLMs may share a stored block only when their pages hold the same bytes in the same order.
Beyond the model, dtype and block, that depends on where the cache lives (a CPU page and a CUDA
page are laid out by different kernels), which attention backend owns it (CPU_ATTN packs K per
ISA; FlashAttention and FlashInfer use their own orders), the physical KV layout (vLLM's
`KVCacheLayout`), and the kernel block: a GPU backend may split vLLM's block into smaller kernel
blocks, each a separate row of the layer's view (0.33's `kv_cache_interface`). All of them go
into the identity, so a CPU and a GPU instance never read each other's pages.

With tensor parallelism each rank holds its own heads: a block is stored once per rank, under a
key derived from the rank-agnostic chain key (`rank_key`), so ranks never overwrite each other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from graph_kvcache_mcp.domain.vllm.kv_blocks import KEY_PREFIX


def device_layout(
    *,
    device: str,
    backend: str,
    kv_layout: str,
    kernel_block: int,
    isa: str,
    cache_dtype: str,
) -> str:
    """The identity's `layout`: device kind, attention backend, physical layout, kernel block,
    kernel ISA (or GPU architecture) and the cache dtype as asked (e.g. `auto`, `fp8`)."""
    parts = (device, backend, kv_layout, f"kb{kernel_block}", isa, cache_dtype)
    if any(not part or ":" in part for part in parts):
        raise ValueError(f"a layout part is empty or holds ':' ({parts!r})")
    return ":".join(parts)


def kernel_rows(layout: str, block_size: int) -> int:
    """Kernel blocks per vLLM block for an identity `layout` made by `device_layout`.

    Raises:
        ValueError: the layout names no kernel block that divides `block_size`.
    """
    parts = layout.split(":")
    kernel = parts[3].removeprefix("kb") if len(parts) > 3 else ""
    if not kernel.isdigit() or int(kernel) == 0 or block_size % int(kernel):
        raise ValueError(f"layout {layout!r} names no kernel block dividing {block_size}")
    return block_size // int(kernel)


def kernel_block_size(block_size: int, sizes: Sequence[int], multiples_of: Sequence[int]) -> int:
    """The kernel block a backend runs a `block_size` block as: the block itself when the
    backend takes a multiple of one of `multiples_of` that divides it, or one of its fixed
    `sizes` in the block; else the largest fixed size that divides the block (vLLM splits
    it into block_size / kernel rows).

    Raises:
        ValueError: no supported kernel block fits the block (vLLM itself would refuse it).
    """
    if block_size in sizes or any(base and block_size % base == 0 for base in multiples_of):
        return block_size
    dividing = [size for size in sizes if size > 0 and block_size % size == 0]
    if not dividing:
        raise ValueError(
            f"no kernel block of {list(sizes)} or a multiple of {list(multiples_of)} divides "
            f"the block of {block_size} tokens"
        )
    return max(dividing)


def tensor_parallel_label(rank: int, size: int) -> str:
    """The identity's `tensor_parallel` field: the ranks' count only, so every rank (and the
    scheduler, which has none) agrees on one chain of keys; `rank_key` then splits by rank."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in 0..{size - 1}")
    return "1/1" if size == 1 else f"tp{size}"


def rank_key(key: str, *, rank: int, size: int) -> str:
    """Rank `rank`'s own key for the chain key `key` (the key itself without parallelism)."""
    if size == 1:
        return key
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in 0..{size - 1}")
    digest = hashlib.sha256(b"vkv-rank\0%s\0%d\0%d" % (key.encode(), rank, size)).digest()
    return KEY_PREFIX + digest.hex()


def every_rank_keys(keys: Sequence[str], size: int) -> list[str]:
    """Each rank's key of each chain key, block by block (block 0's ranks 0..size-1, then block
    1's...): a block is held only when every rank's part of it is. `keys` itself for one rank."""
    if size == 1:
        return list(keys)
    return [rank_key(key, rank=rank, size=size) for key in keys for rank in range(size)]


def held_by_every_rank(present: Sequence[bool], size: int) -> list[bool]:
    """Per block, whether every rank holds it, from answers for `every_rank_keys`."""
    if len(present) % size:
        raise ValueError(f"{len(present)} answers are not {size} per block")
    return [all(present[start : start + size]) for start in range(0, len(present), size)]
