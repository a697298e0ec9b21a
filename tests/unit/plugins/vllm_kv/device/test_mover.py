"""The device path's ordering, on CPU tensors with `RecordingStreams` standing in for CUDA streams
(a test double: no GPU here). Saves: compute event, side stream waits, copy, done event, and the
upload's encoding waits for it; loads: the load stream waits on the compute stream, the lane waits
for its copy before its slot is reused, the window settles the load stream, the compute stream
waits for the loads before `start_load_kv` returns."""

from __future__ import annotations

import pytest
import torch

from graph_kvcache_mcp.domain.vllm.engine_kv.device import device_layout
from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity, encode_block
from graph_kvcache_mcp.plugins.vllm_kv.device.mover import DeviceBlocks, encoder
from graph_kvcache_mcp.plugins.vllm_kv.device.pages import dense_pages
from graph_kvcache_mcp.plugins.vllm_kv.device.streams import ImmediateStreams
from graph_kvcache_mcp.plugins.vllm_kv.pages import PagedKvCache
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from tests.support.copy_streams import RecordingStreams
from tests.unit.plugins.vllm_kv.device.test_pages import BLOCKS, cpu_caches

PAGE_BYTES = 2 * 4 * 16 * 2


def identity(layers: int = 3) -> KvModelIdentity:
    return KvModelIdentity(
        served_model="tiny",
        architecture="LlamaForCausalLM",
        dtype="bfloat16",
        num_layers=layers,
        num_kv_heads=2,
        head_size=8,
        head_size_v=8,
        block_size=4,
        page_bytes=PAGE_BYTES,
        layout=device_layout(
            device="cpu",
            backend="CPU_ATTN",
            kv_layout="LBHNC",
            kernel_block=4,
            isa="vec",
            cache_dtype="auto",
        ),
        vllm_version="0.32.0",
    )


def blocks_on(
    caches: dict[str, torch.Tensor], streams: RecordingStreams, store: EngineBlockStore
) -> DeviceBlocks:
    pages = dense_pages(caches, num_blocks=BLOCKS, kernel_rows=1)
    return DeviceBlocks(pages, streams, store, identity())


def test_a_save_copies_after_the_compute_event_and_encodes_after_the_copy(
    unreachable_store: EngineBlockStore,
) -> None:
    caches, streams = cpu_caches(), RecordingStreams()
    device = blocks_on(caches, streams, unreachable_store)
    items, fence = device.copy_out(["k4", "k1"], [4, 1])
    assert streams.log == ["record e1 on compute", "save stream waits e1", "record e2 on save"]
    assert not fence.query()  # queued, not run: the upload must wait for it
    encode = encoder(device.identity, fence)
    values = [encode(key, payload) for key, payload in items]
    assert streams.log[3:] == ["host waits e2", "copy on save", "host waits e2"]
    cpu = PagedKvCache(caches)
    assert values == [
        encode_block(key, device.identity, b"".join(cpu.page_views(block)))
        for key, block in (("k4", 4), ("k1", 1))
    ]


def test_a_received_block_is_copied_in_after_the_compute_event_before_its_slot_returns(
    unreachable_store: EngineBlockStore,
) -> None:
    caches, streams = cpu_caches(seed=5), RecordingStreams()
    device = blocks_on(caches, streams, unreachable_store)
    source = cpu_caches(seed=6)
    payload = b"".join(PagedKvCache(source).page_views(2))
    slot = device.loader._slots.take()  # a slot as a lane receives into it
    slot[:] = payload
    device._after = streams.record_compute()
    device.write_block(3, slot)
    assert streams.log == [
        "record e1 on compute",
        "load stream waits e1",
        "record e2 on load",
        "host waits e2",
        "copy on load",
    ]
    assert b"".join(PagedKvCache(caches).page_views(3)) == payload


def test_a_load_settles_the_load_stream_and_the_compute_stream_waits_for_it(
    unreachable_store: EngineBlockStore,
) -> None:
    streams = RecordingStreams()
    device = blocks_on(cpu_caches(), streams, unreachable_store)
    result = device.load(["k0", "k1"], [0, 1])
    assert (result.loaded_blocks, result.failure is not None) == (0, True)
    assert streams.log == [
        "record e1 on compute",
        "host waits load stream",  # the write window's settle, as it closes
        "load stream waits done",
        "record e2 on load",
        "compute waits e2",
    ]


def test_on_cpu_the_immediate_streams_copy_at_once(unreachable_store: EngineBlockStore) -> None:
    caches = cpu_caches(seed=2)
    pages = dense_pages(caches, num_blocks=BLOCKS, kernel_rows=1)
    device = DeviceBlocks(pages, ImmediateStreams(), unreachable_store, identity())
    items, fence = device.copy_out(["k"], [5])
    assert fence.query()
    assert bytes(items[0][1]) == b"".join(PagedKvCache(caches).page_views(5))


def test_pages_that_do_not_match_the_identity_are_refused(
    unreachable_store: EngineBlockStore,
) -> None:
    pages = dense_pages(cpu_caches(layers=2), num_blocks=BLOCKS, kernel_rows=1)
    with pytest.raises(ValueError, match="promised 3"):
        DeviceBlocks(pages, ImmediateStreams(), unreachable_store, identity())
