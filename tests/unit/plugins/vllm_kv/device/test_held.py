"""Held blocks: with async saves, vLLM keeps a finished request's blocks until the worker reports
its copies done; both sides follow one rule, so every held request is released."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.domain.vllm.kv_plan import BlockTransfer
from graph_kvcache_mcp.plugins.vllm_kv.device.held import HeldSaves, SchedulerHolds
from graph_kvcache_mcp.plugins.vllm_kv.identity import ConnectorSetup
from graph_kvcache_mcp.plugins.vllm_kv.metadata import EngineKVMetadata
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from graph_kvcache_mcp.plugins.vllm_kv.worker_side import WorkerSide
from tests.support.copy_streams import RecordingStreams
from tests.unit.plugins.vllm_kv.device.test_mover import identity
from tests.unit.plugins.vllm_kv.device.test_pages import BLOCKS, cpu_caches


def test_the_scheduler_holds_only_requests_it_planned_async_saves_for() -> None:
    holds = SchedulerHolds(async_saves=True)
    holds.planned(["a", "b"])
    assert (holds.finished("a"), holds.finished("c")) == (True, False)
    assert holds.finished("a") is False  # vLLM finishes a request once: nothing is kept
    cpu = SchedulerHolds(async_saves=False)
    cpu.planned(["a"])
    assert cpu.finished("a") is False


def test_finished_requests_are_released_once_their_copies_are_done() -> None:
    streams = RecordingStreams()
    copied: list[str] = []
    held = HeldSaves()
    first = streams.on_save_stream(streams.record_compute(), lambda: copied.append("a"))
    held.saving("a", first)
    held.saving("b", streams.on_save_stream(streams.record_compute(), lambda: copied.append("b")))
    assert held.in_flight() == 2
    assert held.release(["a", "never-saved"]) == {"a"}
    assert copied == ["a"] and first.query()  # released only after its copy ran
    assert held.release(["a"]) == set()  # reported once
    held.wait_all()
    assert copied == ["a", "b"] and held.in_flight() == 0
    assert held.release(["b"]) == {"b"}  # still named when vLLM finishes it later


@pytest.fixture
def worker() -> Iterator[tuple[WorkerSide, RecordingStreams, dict[str, torch.Tensor]]]:
    client = SyncKvClient("http://127.0.0.1:9", None, timeout_s=2.0)
    store = EngineBlockStore(client, timeout_s=2.0, concurrency=2)
    setup = ConnectorSetup(identity(), None, None, store, num_blocks=BLOCKS, async_saves=True)
    streams = RecordingStreams()
    side = WorkerSide(setup, streams)
    caches = cpu_caches()
    side.register(caches)
    # A forward step "runs" throughout: queued uploads wait (up to 10 s) before they encode,
    # so the test alone decides when a copy's fence is waited on.
    store.uploads.step_started()
    yield side, streams, caches
    store.uploads.step_ended()
    store.close(flush_timeout_s=0.0)


def test_the_worker_reports_a_saved_request_as_sent_once_vllm_finished_it(
    worker: tuple[WorkerSide, RecordingStreams, dict[str, torch.Tensor]],
) -> None:
    side, streams, _ = worker
    saves = [BlockTransfer("r1", [0, 1], ["k0", "k1"]), BlockTransfer("r2", [2], ["k2"])]
    side.save(EngineKVMetadata(saves=saves))
    assert side.take_transfer_results().finished_sending == set()  # not finished yet
    results = side.take_transfer_results({"r1", "r3"})
    assert results.finished_sending == {"r1"}
    assert "copy on save" in streams.log  # released after the copy ran, not before
    assert side.take_transfer_results({"r2"}).finished_sending == {"r2"}


def test_preemption_waits_for_every_copy_in_flight(
    worker: tuple[WorkerSide, RecordingStreams, dict[str, torch.Tensor]],
) -> None:
    side, streams, _ = worker
    side.save(EngineKVMetadata(saves=[BlockTransfer("r1", [3], ["k3"])]))
    assert side.held.in_flight() == 1
    side.wait_for_copies()
    assert side.held.in_flight() == 0 and "copy on save" in streams.log


def test_a_save_that_cannot_be_copied_still_releases_its_request(
    worker: tuple[WorkerSide, RecordingStreams, dict[str, torch.Tensor]],
) -> None:
    side, _, _ = worker
    side.save(EngineKVMetadata(saves=[BlockTransfer("r1", [BLOCKS + 3], ["bad"])]))
    assert side.take_transfer_results({"r1"}).finished_sending == {"r1"}
