"""The connector identity's device part: a CPU and a GPU instance of the same model never share a
key, a split kernel block or another backend is another identity, and each tensor-parallel rank
stores under its own key."""

from __future__ import annotations

import pytest

from graph_kvcache_mcp.domain.vllm.engine_kv.device import (
    device_layout,
    every_rank_keys,
    held_by_every_rank,
    kernel_block_size,
    kernel_rows,
    rank_key,
    tensor_parallel_label,
)
from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity, block_keys
from tests.unit.domain.test_vllm_kv_identity_file import IDENTITY

CPU = {"device": "cpu", "backend": "CPU_ATTN", "kv_layout": "LBHNC", "isa": "vec"}
GPU = {"device": "cuda", "backend": "FLASH_ATTN", "kv_layout": "NHD", "isa": "sm90"}


def identity(layout: str, tensor_parallel: str = "1/1") -> KvModelIdentity:
    return IDENTITY.model_copy(update={"layout": layout, "tensor_parallel": tensor_parallel})


def keys(layout: str) -> list[str]:
    return block_keys(identity(layout).digest, list(range(96)), 32)


def test_a_cpu_and_a_gpu_instance_of_one_model_share_no_key() -> None:
    cpu = device_layout(**CPU, kernel_block=32, cache_dtype="auto")
    gpu = device_layout(**GPU, kernel_block=32, cache_dtype="auto")
    assert cpu == "cpu:CPU_ATTN:LBHNC:kb32:vec:auto"
    assert not set(keys(cpu)) & set(keys(gpu))


@pytest.mark.parametrize(
    "change",
    [{"backend": "FLASHINFER"}, {"kv_layout": "HND"}, {"isa": "sm100"}],
)
def test_another_backend_layout_or_architecture_is_another_identity(
    change: dict[str, str],
) -> None:
    base = device_layout(**GPU, kernel_block=16, cache_dtype="auto")
    other = device_layout(**{**GPU, **change}, kernel_block=16, cache_dtype="auto")
    assert identity(base).digest != identity(other).digest


def test_a_block_split_into_kernel_blocks_is_another_identity() -> None:
    whole = device_layout(**GPU, kernel_block=32, cache_dtype="auto")
    split = device_layout(**GPU, kernel_block=16, cache_dtype="auto")
    assert not set(keys(whole)) & set(keys(split))


def test_a_part_that_would_blur_the_fields_is_refused() -> None:
    with pytest.raises(ValueError, match="':'"):
        device_layout(**{**CPU, "isa": "a:b"}, kernel_block=32, cache_dtype="auto")


@pytest.mark.parametrize(
    ("block", "sizes", "bases", "kernel"),
    [
        (128, [], [32], 128),  # CPU_ATTN: any multiple of 32
        (544, [16, 32, 64], [], 32),  # a fixed-size backend splits the block into rows
        (64, [16, 32, 64], [], 64),
        (576, [], [16], 576),
    ],
)
def test_the_kernel_block_follows_the_backends_supported_sizes(
    block: int, sizes: list[int], bases: list[int], kernel: int
) -> None:
    assert kernel_block_size(block, sizes, bases) == kernel


def test_a_block_no_kernel_fits_is_refused() -> None:
    with pytest.raises(ValueError, match="divides"):
        kernel_block_size(24, [16], [])


def test_each_tensor_parallel_rank_stores_under_its_own_key() -> None:
    chain = keys(device_layout(**CPU, kernel_block=32, cache_dtype="auto"))
    assert [rank_key(key, rank=0, size=1) for key in chain] == chain  # no parallelism: as is
    per_rank = [[rank_key(key, rank=rank, size=2) for key in chain] for rank in range(2)]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert not set(per_rank[0]) & set(chain)
    assert all(key.startswith("vkv1:") and len(key) == len(chain[0]) for key in per_rank[1])
    with pytest.raises(ValueError, match="rank 2"):
        rank_key(chain[0], rank=2, size=2)


def test_every_rank_key_is_asked_block_by_block_and_one_rank_asks_the_chain_itself() -> None:
    chain = keys(device_layout(**GPU, kernel_block=16, cache_dtype="auto"))
    assert every_rank_keys(chain, 1) == chain  # TP=1: the same keys, as many HEADs as before
    asked = every_rank_keys(chain, 2)
    assert asked == [rank_key(key, rank=rank, size=2) for key in chain for rank in (0, 1)]


def test_a_block_is_held_only_where_every_rank_holds_it() -> None:
    # block 0: both ranks; block 1: rank 1 misses; block 2: both again
    assert held_by_every_rank([True, True, True, False, True, True], 2) == [True, False, True]
    assert held_by_every_rank([True, False], 1) == [True, False]
    with pytest.raises(ValueError, match="not 2 per block"):
        held_by_every_rank([True, True, True], 2)


def test_the_identity_counts_the_ranks_so_tp2_is_not_tp1() -> None:
    layout = device_layout(**CPU, kernel_block=32, cache_dtype="auto")
    assert tensor_parallel_label(0, 1) == "1/1"  # a single rank keeps its existing keys
    assert tensor_parallel_label(0, 2) == tensor_parallel_label(1, 2) == "tp2"
    assert identity(layout).digest != identity(layout, tensor_parallel_label(1, 2)).digest


def test_kernel_rows_are_read_back_from_the_layout_device_layout_made() -> None:
    layout = device_layout(
        device="cuda",
        backend="FLASH_ATTN",
        kv_layout="NHD",
        kernel_block=16,
        isa="sm90",
        cache_dtype="auto",
    )
    assert kernel_rows(layout, 64) == 4
    assert kernel_rows(layout, 16) == 1


@pytest.mark.parametrize("layout", ["cpu:CPU_ATTN:LBHNC", "cpu:CPU_ATTN:LBHNC:kb0:vec:auto"])
def test_a_layout_without_a_usable_kernel_block_is_refused(layout: str) -> None:
    with pytest.raises(ValueError, match="no kernel block"):
        kernel_rows(layout, 32)


def test_a_kernel_block_that_does_not_divide_the_block_is_refused() -> None:
    with pytest.raises(ValueError, match="dividing 24"):
        kernel_rows("cuda:FLASH_ATTN:NHD:kb16:sm90:auto", 24)
