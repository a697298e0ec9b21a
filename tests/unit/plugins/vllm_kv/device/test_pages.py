"""Device pages on real CPU tensors: the bytes the CPU path moves, K/V and kernel-block splits,
permuted views, and layouts refused rather than moved wrongly."""

from __future__ import annotations

import pytest
import torch

from graph_kvcache_mcp.plugins.vllm_kv.device.pages import DevicePages, dense_pages, view_placements
from graph_kvcache_mcp.plugins.vllm_kv.pages import PagedKvCache
from graph_kvcache_mcp.plugins.vllm_kv.raw_pages import Placement, RawPages

BLOCKS = 6


def random_bytes(count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=generator)


def cpu_caches(layers: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """CPU vLLM's dense caches: one `[blocks, heads, tokens, head_size * 2]` bf16 view a layer."""
    shape = (BLOCKS, 2, 4, 16)
    size = 2 * BLOCKS * 2 * 4 * 16
    return {
        f"model.layers.{i}.attn": random_bytes(size, seed + i).view(torch.bfloat16).view(shape)
        for i in range(layers)
    }


def block_rows(block_ids: list[int], layers: int) -> list[list[int]]:
    return [[block] * layers for block in block_ids]


def test_a_dense_cpu_cache_gathers_the_bytes_the_cpu_path_stores() -> None:
    caches = cpu_caches()
    pages = dense_pages(caches, num_blocks=BLOCKS, kernel_rows=1)
    rows = pages.gather(pages.layer_names, block_rows([4, 0, 2], 3))
    cpu = PagedKvCache(caches)
    assert [bytes(row.numpy()) for row in rows] == [
        b"".join(cpu.page_views(block)) for block in (4, 0, 2)
    ]


def test_a_dense_cpu_cache_scatters_as_the_cpu_path_writes() -> None:
    source = cpu_caches(seed=1)
    values = [b"".join(PagedKvCache(source).page_views(block)) for block in (1, 5)]
    by_device, by_cpu = cpu_caches(seed=7), cpu_caches(seed=7)
    pages = dense_pages(by_device, num_blocks=BLOCKS, kernel_rows=1)
    rows = torch.stack([torch.frombuffer(bytearray(value), dtype=torch.uint8) for value in values])
    pages.scatter(rows, pages.layer_names, block_rows([3, 0], 3))
    cpu = PagedKvCache(by_cpu)
    cpu.write_block(3, memoryview(values[0]))
    cpu.write_block(0, memoryview(values[1]))
    # as bytes: random bf16 bits hold NaNs, which never equal themselves
    assert all(
        torch.equal(by_device[name].view(torch.uint8), by_cpu[name].view(torch.uint8))
        for name in by_cpu
    )
    assert not torch.equal(
        by_cpu["model.layers.0.attn"].view(torch.uint8),
        cpu_caches(seed=7)["model.layers.0.attn"].view(torch.uint8),
    )


def test_placed_pages_of_one_allocation_match_raw_pages_both_ways() -> None:
    """A hybrid-like allocation: two layers' pages interleaved block by block (block-outer)."""
    page, stride = 96, 2 * 96 + 32  # padding between blocks
    allocation = random_bytes(BLOCKS * stride, 3)
    placements = {"a": Placement(0, stride, page), "b": Placement(page, stride, page)}
    raw = RawPages({"a": allocation, "b": allocation}, placements, BLOCKS)
    pages = DevicePages({name: (allocation, [place]) for name, place in placements.items()}, BLOCKS)
    rows = pages.gather(["a", "b"], [[2, 5], [0, 0]])
    assert bytes(rows[0].numpy()) == raw.read(["a", "b"], [2, 5])
    assert bytes(rows[1].numpy()) == raw.read(["a", "b"], [0, 0])
    payload = bytes(random_bytes(2 * page, 4).numpy())
    twin = allocation.clone()
    pages.scatter(
        torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(1, -1), ["a", "b"], [[1, 3]]
    )
    RawPages({"a": twin, "b": twin}, placements, BLOCKS).write(
        ["a", "b"], [(1,), (3,)], memoryview(payload)
    )
    assert torch.equal(allocation, twin)


def flash_layer(
    kernel_rows: int, *, heads_outer: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's `[2, kernel blocks, kernel block, heads, dim]` view of one layer, over a
    physical `[2, kernel blocks, heads, kernel block, dim]` buffer when `heads_outer` (HND)."""
    kernel_block, heads, dim = 4, 2, 8
    rows = BLOCKS * kernel_rows
    physical = random_bytes(2 * rows * kernel_block * heads * dim * 2, seed).view(torch.float16)
    if heads_outer:
        view = physical.view(2, rows, heads, kernel_block, dim).permute(0, 1, 3, 2, 4)
    else:
        view = physical.view(2, rows, kernel_block, heads, dim)
    return physical, view


def expected_flash_block(physical: torch.Tensor, kernel_rows: int, block: int) -> bytes:
    """A block's K rows, then its V rows, as memory holds them."""
    halves = physical.view(torch.uint8).view(2, BLOCKS * kernel_rows, -1)
    rows = slice(block * kernel_rows, (block + 1) * kernel_rows)
    return b"".join(bytes(halves[kv, rows].contiguous().numpy()) for kv in (0, 1))


@pytest.mark.parametrize("kernel_rows", [1, 4])
@pytest.mark.parametrize("heads_outer", [False, True])
def test_flash_attention_views_split_k_and_v_and_keep_kernel_rows_together(
    kernel_rows: int, heads_outer: bool
) -> None:
    physical, view = flash_layer(kernel_rows, heads_outer=heads_outer, seed=kernel_rows)
    assert view.is_contiguous() is not heads_outer
    placements = view_placements("l0", view, num_blocks=BLOCKS, kernel_rows=kernel_rows)
    half = physical.numel() * 2 // 2
    run = half // BLOCKS
    assert placements == [Placement(0, run, run), Placement(half, run, run)]
    pages = dense_pages({"l0": view}, num_blocks=BLOCKS, kernel_rows=kernel_rows)
    rows = pages.gather(["l0"], [[3], [5]])
    assert bytes(rows[0].numpy()) == expected_flash_block(physical, kernel_rows, 3)
    assert bytes(rows[1].numpy()) == expected_flash_block(physical, kernel_rows, 5)


def test_kernel_rows_with_other_layers_between_them_are_moved_row_by_row() -> None:
    """A block-outer packed cache: each kernel row of a layer sits beside the other layer's."""
    kernel_rows, row = 2, 64
    physical = random_bytes(BLOCKS * kernel_rows * 2 * row, 9).view(BLOCKS * kernel_rows, 2, row)
    view = physical[:, 0]  # layer 0's rows: every other run of `row` bytes
    placements = view_placements("l0", view, num_blocks=BLOCKS, kernel_rows=kernel_rows)
    assert placements == [Placement(0, 4 * row, row), Placement(2 * row, 4 * row, row)]
    rows = dense_pages({"l0": view}, num_blocks=BLOCKS, kernel_rows=kernel_rows).gather(
        ["l0"], [[4]]
    )
    assert bytes(rows[0].numpy()) == bytes(physical[8:10, 0].contiguous().numpy())


def test_gather_then_scatter_into_other_blocks_copies_those_blocks_exactly() -> None:
    physical, view = flash_layer(2, heads_outer=True, seed=11)
    pages = dense_pages({"l0": view}, num_blocks=BLOCKS, kernel_rows=2)
    pages.scatter(pages.gather(["l0"], [[1], [2]]), ["l0"], [[4], [0]])
    assert expected_flash_block(physical, 2, 4) == expected_flash_block(physical, 2, 1)
    assert expected_flash_block(physical, 2, 0) == expected_flash_block(physical, 2, 2)
    assert expected_flash_block(physical, 2, 3) != expected_flash_block(physical, 2, 1)


def test_a_view_without_a_block_dimension_is_refused() -> None:
    with pytest.raises(ValueError, match="no dimension of 6 blocks x 2 kernel rows"):
        view_placements("l0", torch.zeros(BLOCKS, 4, 8), num_blocks=BLOCKS, kernel_rows=2)


def test_a_view_whose_rows_are_not_dense_is_refused() -> None:
    half_heads = torch.zeros(BLOCKS, 4, 8)[:, :, :4]  # every row skips half its bytes
    with pytest.raises(ValueError, match="not dense"):
        view_placements("l0", half_heads, num_blocks=BLOCKS, kernel_rows=1)


def test_pages_beyond_their_allocation_and_block_ids_out_of_range_are_refused() -> None:
    allocation = torch.zeros(BLOCKS * 10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="do not lie apart inside"):
        DevicePages({"a": (allocation, [Placement(10, 10, 10)])}, BLOCKS)
    pages = DevicePages({"a": (allocation, [Placement(0, 10, 10)])}, BLOCKS)
    with pytest.raises(ValueError, match=r"not in 0\.\.5"):
        pages.gather(["a"], [[6]])
    with pytest.raises(ValueError, match="are not 1 values of 10"):
        pages.scatter(torch.zeros(1, 9, dtype=torch.uint8), ["a"], [[0]])
