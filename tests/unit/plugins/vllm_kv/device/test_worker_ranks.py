"""The worker side under tensor parallelism, on CPU tensors through the device copy path: each
rank saves and loads under its own keys (`rank_key` of the scheduler's chain keys), one rank
under the chain keys themselves, and a worker whose vLLM runs another TP size than its config
promised refuses to register.

`RecordingStore` is a test double for the engine side of the store: no engine runs in vLLM's
venv (its binary is not installed there). It records what the worker asks of the store; the
saved values are encoded as the upload thread would, so their headers are checked too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.http_response import BodySink
from graph_kvcache_mcp.domain.outcomes import Miss, Outcome
from graph_kvcache_mcp.domain.vllm.engine_kv.device import rank_key
from graph_kvcache_mcp.domain.vllm.kv_blocks import RejectedBlock, decode_block
from graph_kvcache_mcp.domain.vllm.kv_plan import BlockTransfer
from graph_kvcache_mcp.plugins.vllm_kv.device.streams import ImmediateStreams
from graph_kvcache_mcp.plugins.vllm_kv.identity import ConnectorSetup
from graph_kvcache_mcp.plugins.vllm_kv.metadata import EngineKVMetadata
from graph_kvcache_mcp.plugins.vllm_kv.pages import PagedKvCache
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from graph_kvcache_mcp.plugins.vllm_kv.uploads import Encode, Payload
from graph_kvcache_mcp.plugins.vllm_kv.worker_side import WorkerSide
from tests.unit.plugins.vllm_kv.device.test_mover import identity
from tests.unit.plugins.vllm_kv.device.test_pages import BLOCKS, cpu_caches

CHAIN = ["vkv1:chain-a", "vkv1:chain-b"]


class RecordingStore(EngineBlockStore):
    """Test double (no engine in vLLM's venv): keeps saved values, answers every load a miss."""

    def __init__(self) -> None:
        super().__init__(
            SyncKvClient("http://127.0.0.1:9", None, timeout_s=1.0), timeout_s=1.0, concurrency=1
        )
        self.saved: dict[str, bytes] = {}
        self.asked: list[str] = []

    def save_later(
        self, items: Sequence[tuple[str, Payload]], encode: Encode | None = None
    ) -> None:
        assert encode is not None
        self.saved.update((key, encode(key, payload)) for key, payload in items)

    def fetch_into(
        self, keys: Sequence[str], sinks: Sequence[BodySink], *, expect_bytes: int = 0
    ) -> list[Outcome[int]]:
        self.asked += keys
        return [Miss()] * len(keys)


@pytest.fixture
def store() -> Iterator[RecordingStore]:
    recording = RecordingStore()
    yield recording
    recording.close(flush_timeout_s=0.0)


def worker(store: EngineBlockStore, *, ranks: int, rank: int | None) -> WorkerSide:
    setup = ConnectorSetup(
        identity(), None, None, store, num_blocks=BLOCKS, async_saves=True, tensor_parallel=ranks
    )
    return WorkerSide(setup, streams=ImmediateStreams(), rank=rank)


@pytest.mark.parametrize(("ranks", "rank"), [(2, 0), (2, 1), (4, 3)])
def test_a_rank_saves_and_loads_its_blocks_under_its_own_keys(
    store: RecordingStore, ranks: int, rank: int
) -> None:
    caches = cpu_caches(seed=3)
    side = worker(store, ranks=ranks, rank=rank)
    side.register(caches)
    side.save(EngineKVMetadata(saves=[BlockTransfer("r", [4, 1], list(CHAIN))]))
    own = [rank_key(key, rank=rank, size=ranks) for key in CHAIN]
    assert list(store.saved) == own
    pages = PagedKvCache(caches)
    for key, block in zip(own, (4, 1), strict=True):
        payload = decode_block(store.saved[key], key, side.identity)
        assert not isinstance(payload, RejectedBlock)
        assert bytes(payload) == b"".join(pages.page_views(block))
    side.start_loads(EngineKVMetadata(loads=[BlockTransfer("r", [2, 3], list(CHAIN))]))
    assert store.asked == own
    assert side.take_load_errors() == {2, 3}  # missed: vLLM recomputes them on every rank


def test_one_rank_keeps_the_chain_keys(store: RecordingStore) -> None:
    side = worker(store, ranks=1, rank=None)  # vLLM's parallel state is not set up: one rank
    side.register(cpu_caches())
    side.save(EngineKVMetadata(saves=[BlockTransfer("r", [0, 5], list(CHAIN))]))
    side.start_loads(EngineKVMetadata(loads=[BlockTransfer("r", [2, 3], list(CHAIN))]))
    assert (list(store.saved), store.asked) == (CHAIN, CHAIN)


def test_a_worker_whose_vllm_runs_another_tp_size_than_promised_refuses_to_register(
    store: RecordingStore,
) -> None:
    side = worker(store, ranks=2, rank=None)  # here vLLM reports one rank
    with pytest.raises(ValueError, match=r"rank 0 of 1 tensor-parallel ranks.*promised 2"):
        side.register(cpu_caches())


def test_a_rank_outside_the_size_is_refused(store: RecordingStore) -> None:
    with pytest.raises(ValueError, match=r"rank 2 is not in 0\.\.1"):
        worker(store, ranks=2, rank=2).register(cpu_caches())
