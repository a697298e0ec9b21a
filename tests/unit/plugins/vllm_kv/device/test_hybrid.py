"""A hybrid's device copy path on real CPU tensors: the bytes `HybridPages`/`RawPages` move on
CPU, and the order of its copies, with `RecordingStreams` standing in for CUDA streams (a test
double: no GPU here).

The allocation is laid out as vLLM overlays a hybrid's groups: three page slots per block, the
attention layers and the Mamba groups' layers sharing them (a block id belongs to one group at a
time), with 4-dim views of the attention layers where their placements say.
"""

from __future__ import annotations

import pytest
import torch

from graph_kvcache_mcp.domain.vllm.hybrid.kv_plan import HybridLoad, StateTransfer
from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity, encode_block
from graph_kvcache_mcp.domain.vllm.kv_plan import BlockTransfer
from graph_kvcache_mcp.plugins.vllm_kv.device.hybrid import DeviceHybrid, hybrid_pages
from graph_kvcache_mcp.plugins.vllm_kv.device.mover import encoder
from graph_kvcache_mcp.plugins.vllm_kv.device.streams import CopyStreams, ImmediateStreams
from graph_kvcache_mcp.plugins.vllm_kv.hybrid import HybridLayout, HybridPages, state_identity
from graph_kvcache_mcp.plugins.vllm_kv.identity import ConnectorSetup
from graph_kvcache_mcp.plugins.vllm_kv.metadata import EngineKVMetadata
from graph_kvcache_mcp.plugins.vllm_kv.raw_pages import Placement, RawPages
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from graph_kvcache_mcp.plugins.vllm_kv.worker_side import WorkerSide
from tests.support.copy_streams import RecordingStreams
from tests.unit.plugins.vllm_kv.device.test_mover import identity as dense_identity

BLOCKS = 6
PAGE = 2 * 2 * 4 * 2  # K and V, 2 tokens, 2 heads of 4 bf16: one attention layer's page
SLOTS = 3
BLOCK_STRIDE = SLOTS * PAGE


def slot(index: int) -> Placement:
    return Placement(index * PAGE, BLOCK_STRIDE, PAGE)


LAYOUT = HybridLayout(
    attention_group=2,
    state_groups=(0, 1),
    attention_layers=("attn.0", "attn.1"),
    state_layers=(("mamba.0",), ("mamba.1", "mamba.2")),
    placements={
        "attn.0": slot(0),
        "attn.1": slot(1),
        "mamba.0": slot(2),
        "mamba.1": slot(0),  # overlays attn.0's bytes: another group's blocks
        "mamba.2": slot(1),
    },
    num_blocks=BLOCKS,
    description="test",
    state_page_bytes=PAGE,
)


def identity() -> KvModelIdentity:
    return dense_identity().model_copy(update={"num_layers": 2, "page_bytes": PAGE})


def caches(seed: int) -> dict[str, object]:
    """One allocation of random bytes; attention layers get views, Mamba layers raw tensors."""
    generator = torch.Generator().manual_seed(seed)
    allocation = torch.randint(
        0, 256, (BLOCKS * BLOCK_STRIDE,), dtype=torch.uint8, generator=generator
    )
    registered: dict[str, object] = {}
    for name in LAYOUT.attention_layers:
        start = LAYOUT.placements[name].offset
        view = allocation[start:].view(torch.bfloat16)
        shape, strides = (BLOCKS, 2 * 2, 2, 4), (BLOCK_STRIDE // 2, 8, 4, 1)
        registered[name] = view.as_strided(shape, strides)
    for name in LAYOUT.flat_state_layers:
        registered[name] = [allocation, allocation[:BLOCK_STRIDE]]  # conv and SSM state views
    return registered


def allocation(registered: dict[str, object]) -> torch.Tensor:
    state_views = registered[LAYOUT.flat_state_layers[0]]
    assert isinstance(state_views, list)
    return state_views[0]


def raw(registered: dict[str, object]) -> RawPages:
    return RawPages(registered, LAYOUT.placements, BLOCKS)


def device_on(
    registered: dict[str, object], streams: CopyStreams, store: EngineBlockStore
) -> DeviceHybrid:
    ident = identity()
    return DeviceHybrid(
        hybrid_pages(registered, LAYOUT),
        LAYOUT,
        streams,
        store,
        ident,
        state_identity(ident, LAYOUT),
    )


SAVES = [BlockTransfer("r1", [4, 1], ["k4", "k1"]), BlockTransfer("r2", [0], ["k0"])]
STATES = [StateTransfer("r1", "s1", ((3,), (5,))), StateTransfer("r2", "s2", ((2, 4), (1,)))]


def test_saved_blocks_and_states_hold_the_bytes_hybrid_pages_copies_on_cpu(
    unreachable_store: EngineBlockStore,
) -> None:
    registered = caches(seed=1)
    device = device_on(registered, ImmediateStreams(), unreachable_store)
    blocks, states, fence = device.copy_out(SAVES, STATES)
    assert fence.query()
    ident = identity()
    cpu = HybridPages(registered, LAYOUT, unreachable_store, ident, state_identity(ident, LAYOUT))
    assert [(key, bytes(value)) for key, value in blocks] == cpu.copy_blocks(SAVES)
    assert [(key, bytes(value)) for key, value in states] == cpu.copy_states(STATES)


def test_a_received_block_and_state_land_where_raw_pages_writes_them(
    unreachable_store: EngineBlockStore,
) -> None:
    registered, expected = caches(seed=2), caches(seed=2)
    device = device_on(registered, ImmediateStreams(), unreachable_store)
    block = torch.randint(0, 256, (2 * PAGE,), dtype=torch.uint8).numpy().tobytes()
    state = torch.randint(0, 256, (3 * PAGE,), dtype=torch.uint8).numpy().tobytes()
    device.write_block(3, memoryview(bytearray(block)))
    device._state_targets = [((1, 4), (5,))]  # as `load` sets them: group 0 fills two blocks
    device.write_state(0, memoryview(bytearray(state)))
    pages = raw(expected)
    pages.write(LAYOUT.attention_layers, [(3,), (3,)], memoryview(block))
    pages.write(LAYOUT.flat_state_layers, [(1, 4), (5,), (5,)], memoryview(state))
    assert torch.equal(allocation(registered), allocation(expected))
    assert not torch.equal(allocation(registered), allocation(caches(seed=2)))  # it wrote


def test_one_save_copy_after_the_compute_event_and_uploads_wait_for_it(
    unreachable_store: EngineBlockStore,
) -> None:
    registered, streams = caches(seed=3), RecordingStreams()
    device = device_on(registered, streams, unreachable_store)
    blocks, states, fence = device.copy_out(SAVES, STATES)
    assert streams.log == ["record e1 on compute", "save stream waits e1", "record e2 on save"]
    assert not fence.query()  # queued, not run: the uploads must wait for it
    encoded = [encoder(device.identity, fence)(key, value) for key, value in blocks]
    encoded += [encoder(device.state_identity, fence)(key, value) for key, value in states]
    assert streams.log[3:5] == ["host waits e2", "copy on save"]
    assert streams.log.count("copy on save") == 1  # blocks and states in one copy
    ident = identity()
    cpu = HybridPages(registered, LAYOUT, unreachable_store, ident, state_identity(ident, LAYOUT))
    assert encoded == [
        encode_block(key, ident, [value]) for key, value in cpu.copy_blocks(SAVES)
    ] + [
        encode_block(key, device.state_identity, [value]) for key, value in cpu.copy_states(STATES)
    ]


def test_a_received_state_is_copied_in_after_the_compute_event_before_its_slot_returns(
    unreachable_store: EngineBlockStore,
) -> None:
    registered, streams = caches(seed=4), RecordingStreams()
    device = device_on(registered, streams, unreachable_store)
    received = device.states._slots.take()  # a slot as a lane receives into it
    received[:] = bytes(range(3 * PAGE))
    device._state_targets = [((2,), (0,))]
    device._after = streams.record_compute()
    device.write_state(0, received)
    assert streams.log == [
        "record e1 on compute",
        "load stream waits e1",
        "record e2 on load",
        "host waits e2",
        "copy on load",
    ]
    pages = raw(registered)
    assert pages.read(LAYOUT.flat_state_layers, [2, 0, 0]) == bytes(range(3 * PAGE))


def test_a_hybrid_load_settles_the_load_stream_and_the_compute_stream_waits_for_it(
    unreachable_store: EngineBlockStore,
) -> None:
    streams = RecordingStreams()
    device = device_on(caches(seed=5), streams, unreachable_store)
    load = HybridLoad(
        BlockTransfer("r1", [0, 1], ["k0", "k1"]), StateTransfer("r1", "s", ((1,), (1,)))
    )
    loaded, _, failure = device.load(load)
    assert (loaded, failure is not None) == (0, True)
    assert streams.log[0] == "record e1 on compute"
    assert "host waits load stream" in streams.log  # the write window's settle
    assert streams.log[-3:] == ["load stream waits done", "record e2 on load", "compute waits e2"]


def test_pages_that_do_not_match_the_identities_are_refused(
    unreachable_store: EngineBlockStore,
) -> None:
    ident = identity()
    pages = hybrid_pages(caches(seed=6), LAYOUT)
    wrong = ident.model_copy(update={"num_layers": 3})
    with pytest.raises(ValueError, match=r"attention layers .* promised 3"):
        DeviceHybrid(pages, LAYOUT, ImmediateStreams(), unreachable_store, wrong, ident)
    with pytest.raises(ValueError, match=r"Mamba state layers .* promised 2"):
        DeviceHybrid(pages, LAYOUT, ImmediateStreams(), unreachable_store, ident, ident)


def test_layers_of_several_allocations_or_unplaced_are_refused() -> None:
    registered = caches(seed=7)
    registered["mamba.2"] = [torch.zeros(BLOCKS * BLOCK_STRIDE, dtype=torch.uint8)]
    with pytest.raises(ValueError, match="several allocations"):
        hybrid_pages(registered, LAYOUT)
    with pytest.raises(ValueError, match="does not place: extra"):
        hybrid_pages({**caches(seed=7), "extra": torch.zeros(1)}, LAYOUT)


def test_the_worker_moves_a_hybrid_on_the_device_path_and_holds_its_saved_requests(
    unreachable_store: EngineBlockStore,
) -> None:
    ident = identity()
    setup = ConnectorSetup(
        ident,
        state_identity(ident, LAYOUT),
        LAYOUT,
        unreachable_store,
        num_blocks=BLOCKS,
        async_saves=True,
    )
    streams = RecordingStreams()
    side = WorkerSide(setup, streams)
    side.register(caches(seed=8))
    assert isinstance(side._hybrid_pages, DeviceHybrid)
    side.save(EngineKVMetadata(saves=SAVES[:1], state_saves=STATES[1:]))
    assert side.held.in_flight() == 2  # r1 and r2 wait on the one copy
    assert side.take_transfer_results(["r2"]).finished_sending == {"r2"}
    assert "copy on save" in streams.log  # released only once its copy ran
    assert side.take_transfer_results(["r1"]).finished_sending == {"r1"}
