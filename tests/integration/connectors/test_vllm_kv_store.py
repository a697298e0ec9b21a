"""The vLLM connector's view of the engine: bounded, never-raising lookups, reads and writes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.domain.outcomes import Hit
from graph_kvcache_mcp.domain.vllm.engine_kv.device import rank_key
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from graph_kvcache_mcp.plugins.vllm_kv.uploads import (
    UPLOAD_NICENESS,
    Payload,
    drain_seconds,
    give_workers_time_to_drain,
)
from tests.support.engines import RunningEngine
from tests.support.peers import garbage_peer, slow_peer


def _store(
    url: str, engine: RunningEngine | None = None, timeout_s: float = 2.0
) -> EngineBlockStore:
    token = engine.token if engine is not None else None
    client = SyncKvClient(url, token, timeout_s=timeout_s)
    return EngineBlockStore(client, timeout_s=timeout_s, concurrency=4)


def _in_child(*lines: str) -> str:
    """What a fresh interpreter running `lines` prints."""
    program = "\n".join(lines)
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout


def _keys(count: int) -> list[str]:
    run = uuid.uuid4().hex
    return [f"vkv1:test-{run}-{i}" for i in range(count)]


def test_count_present_is_the_leading_run_of_stored_keys(memory_engine: RunningEngine) -> None:
    keys = _keys(40)
    with memory_engine.sync_client() as client:
        client.put_many([(key, b"v") for key in keys[:35] if key != keys[20]])
    store = _store(memory_engine.base_url, memory_engine)
    try:
        assert store.count_present(keys) == 20
        assert store.count_present(keys[:20]) == 20
        assert store.count_present(keys[21:]) == 14
    finally:
        store.close()


@pytest.mark.parametrize("missing_at", [0, 5, 11])
def test_with_two_ranks_a_block_counts_only_while_every_ranks_key_is_held(
    memory_engine: RunningEngine, missing_at: int
) -> None:
    """The scheduler's hit rule under tensor parallelism: blocks stored for ranks 0 and 1,
    rank 1's part of block `missing_at` absent: the leading run ends there."""
    chain = _keys(12)
    stored = [
        rank_key(key, rank=rank, size=2)
        for index, key in enumerate(chain)
        for rank in (0, 1)
        if (index, rank) != (missing_at, 1)
    ]
    with memory_engine.sync_client() as client:
        client.put_many([(key, b"v") for key in stored])
    store = _store(memory_engine.base_url, memory_engine)
    try:
        assert store.count_present(chain, ranks=2) == missing_at
        assert store.count_present(chain[missing_at + 1 :], ranks=2) == 11 - missing_at
        assert store.count_present(chain) == 0  # one rank's keys are the chain's: none stored
    finally:
        store.close()


def test_one_rank_asks_for_the_chain_keys_themselves(memory_engine: RunningEngine) -> None:
    chain = _keys(6)
    with memory_engine.sync_client() as client:
        client.put_many([(key, b"v") for key in chain[:4]])
    store = _store(memory_engine.base_url, memory_engine)
    try:
        assert store.count_present(chain, ranks=1) == store.count_present(chain) == 4
        assert store.count_present(chain, ranks=2) == 0  # no rank's key was stored
    finally:
        store.close()


def test_the_hit_source_follows_the_engines_backend(
    memory_engine: RunningEngine, durable_engine: RunningEngine
) -> None:
    """vLLM's prompt_tokens_cached_by_source label for engine hits: host for a memory engine
    here, disk for a durable one, None (external_unspecified) when the engine does not answer."""
    answers = []
    for engine in (memory_engine, durable_engine):
        store = _store(engine.base_url, engine)
        try:
            answers.append(store.hit_source())
        finally:
            store.close()
    assert answers == ["host", "disk"]
    with slow_peer() as url:
        store = _store(url, timeout_s=0.5)
        try:
            assert store.hit_source() is None
        finally:
            store.close()


def test_saved_blocks_are_uploaded_in_the_background_and_fetched_back(
    memory_engine: RunningEngine,
) -> None:
    keys = _keys(3)
    store = _store(memory_engine.base_url, memory_engine)
    try:
        store.save_later([(key, key.encode() * 100) for key in keys[:2]])
        assert store.flush(10.0)
        assert store.fetch(keys) == [keys[0].encode() * 100, keys[1].encode() * 100, None]
    finally:
        store.close()


def test_uploads_run_niced_on_the_cores_they_are_given(memory_engine: RunningEngine) -> None:
    core = max(os.sched_getaffinity(0))
    seen: list[tuple[set[int], int]] = []

    def encode(key: str, data: Payload) -> bytes:  # runs on the upload lane that sends the block
        seen.append((os.sched_getaffinity(0), os.getpriority(os.PRIO_PROCESS, 0)))
        return bytes(data)

    store = _store(memory_engine.base_url, memory_engine)
    try:
        store.uploads.run_uploads_on(frozenset({core}))
        store.save_later([(key, b"block") for key in _keys(3)], encode)
        assert store.flush(10.0)
    finally:
        store.close()
    assert seen == [({core}, UPLOAD_NICENESS)] * 3


class AffinityRecordingSink:
    """A body sink that notes which thread received its value, and where that thread may run."""

    def __init__(self) -> None:
        self.buffer = bytearray(4096)
        self.lane: tuple[int, set[int]] | None = None

    def begin(self, length: int) -> None:
        self.lane = (threading.get_ident(), os.sched_getaffinity(0))

    def target(self) -> memoryview:
        return memoryview(self.buffer)

    def wrote(self, count: int) -> None:
        return

    def ended(self) -> None:
        return


def test_load_lanes_run_on_the_cores_they_are_given_not_only_the_callers(
    memory_engine: RunningEngine,
) -> None:
    """vLLM's worker calls in on a thread bound to its OpenMP cores; the lanes it starts must not
    inherit that binding when the connector gave them every core of the process."""
    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        pytest.skip("needs two cores to bind the calling thread to fewer than the process has")
    keys = _keys(12)
    with memory_engine.sync_client() as client:
        client.put_many([(key, b"v" * 100) for key in keys])
    store = _store(memory_engine.base_url, memory_engine)
    sinks = [AffinityRecordingSink() for _ in keys]
    caller = threading.get_ident()
    os.sched_setaffinity(0, {min(cores)})  # this thread only, as vLLM binds its worker's
    try:
        store.run_loads_on(frozenset(cores))
        answers = store.fetch_into(keys, sinks)
    finally:
        os.sched_setaffinity(0, cores)
        store.close()
    assert answers == [Hit(100)] * len(keys)
    lanes = [sink.lane for sink in sinks if sink.lane is not None and sink.lane[0] != caller]
    assert lanes, "every value was received by the calling thread"
    assert all(allowed == cores for _, allowed in lanes)


def test_the_reserved_cores_are_the_processs_cores_the_calling_thread_is_not_bound_to() -> None:
    """What the connector computes in vLLM's worker, staged in a child bound to one core."""
    printed = _in_child(
        "import os",
        "from graph_kvcache_mcp.plugins.vllm_kv.uploads import reserved_cores",
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(os.getppid()))})",
        "print(sorted(reserved_cores()))",
    )
    ours = os.sched_getaffinity(0)
    assert printed.strip() == str(sorted(ours - {min(ours)}))


def test_a_stopped_engine_is_a_miss_and_later_calls_skip_it(own_engine: RunningEngine) -> None:
    store = _store(own_engine.base_url, own_engine)
    own_engine.managed.stop(term_wait_s=5.0)
    try:
        assert store.count_present(_keys(5)) == 0
        assert store.fetch(_keys(2)) == [None, None]
        store.save_later([(_keys(1)[0], b"x")])  # dropped, not raised
        assert store.flush(5.0)
    finally:
        store.close()


def test_a_hung_engine_costs_one_timeout_then_answers_miss_at_once() -> None:
    with slow_peer(hold_s=10.0) as url:
        store = _store(url, timeout_s=0.5)
        try:
            began = time.monotonic()
            assert store.count_present(_keys(20)) == 0
            first = time.monotonic() - began
            began = time.monotonic()
            assert store.fetch(_keys(3)) == [None, None, None]
            second = time.monotonic() - began
        finally:
            store.close(flush_timeout_s=0.1)
    assert first < 2.0  # the KV timeout bounds the whole batch, not each request
    assert second < 0.1


def test_a_peer_answering_garbage_is_a_miss() -> None:
    with garbage_peer() as url:
        store = _store(url)
        try:
            assert store.count_present(_keys(3)) == 0
            assert store.fetch(_keys(1)) == [None]
        finally:
            store.close(flush_timeout_s=0.1)


def test_the_engine_comes_from_the_environment_and_a_bad_url_is_refused() -> None:
    store = EngineBlockStore.from_environment(
        {
            "EPISTEMIC_GRAPH_KVCACHE_URL": "http://127.0.0.1:9555",
            "EPISTEMIC_GRAPH_KVCACHE_TOKEN": "s3cr3t-token",
        }
    )
    try:
        assert store.client.base_url == "http://127.0.0.1:9555"
        assert "s3cr3t" not in repr(store) + repr(store.client)
    finally:
        store.close()
    with pytest.raises(ConfigError, match="EPISTEMIC_GRAPH_KVCACHE_URL"):
        EngineBlockStore.from_environment({"EPISTEMIC_GRAPH_KVCACHE_URL": "http://10.1.2.3:9"})


def test_the_connector_support_modules_import_only_what_vllm_ships() -> None:
    """vLLM's venv gets the package with --no-deps (and crc32c): no mcp, openai, httpx or
    platformdirs."""
    printed = _in_child(
        "import sys",
        "import graph_kvcache_mcp.plugins.vllm_kv.store",
        "import graph_kvcache_mcp.domain.vllm.kv_plan",
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))",
    )
    third_party = set(printed.split()) - set(sys.stdlib_module_names) - {"graph_kvcache_mcp"}
    third_party = {name for name in third_party if not name.startswith("_")}
    assert third_party <= {
        "anyio",
        "sniffio",
        "idna",
        "pydantic",
        "pydantic_core",
        "typing_extensions",
        "typing_inspection",
        "annotated_types",
        "psutil",  # a dependency of vLLM itself; the engine's holder proof reads processes
        "crc32c",  # the block checksum: the one package run.sh and the docs add to vLLM's venv
    }


def test_first_present_is_the_first_stored_of_keys_in_order(memory_engine: RunningEngine) -> None:
    keys = _keys(20)
    with memory_engine.sync_client() as client:
        client.put_many([(keys[17], b"v"), (keys[19], b"v")])
    store = _store(memory_engine.base_url, memory_engine)
    try:
        assert store.first_present(keys) == 17
        assert store.first_present(keys[:17]) is None
    finally:
        store.close()


def test_a_drain_waits_for_queued_saves_and_says_so(
    memory_engine: RunningEngine, caplog: pytest.LogCaptureFixture
) -> None:
    keys = _keys(4)
    store = _store(memory_engine.base_url, memory_engine)
    try:
        store.save_later([(key, b"x" * 1000) for key in keys])
        with caplog.at_level("INFO", logger="vllm.graph_kvcache.engine_kv"):
            store.drain(10.0)
        assert store.pending() == (0, 0)
        assert store.first_present(keys) == 0 and store.count_present(keys) == 4
        said = caplog.text
        assert "the saves were answered in" in said or "every save is in the engine" in said
    finally:
        store.close()


def test_a_drain_that_runs_out_of_time_names_what_was_not_saved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with slow_peer(hold_s=3.0) as url:
        store = _store(url, timeout_s=2.5)
        try:
            store.save_later([(key, b"x" * 100) for key in _keys(2)])
            with caplog.at_level("INFO", logger="vllm.graph_kvcache.engine_kv"):
                store.drain(0.5)
            assert "gave up after 0.5 s with 2 blocks (200 bytes) not saved" in caplog.text
            assert "EPISTEMIC_GRAPH_KVCACHE_DRAIN_S" in caplog.text
        finally:
            store.close()


def test_vllm_is_told_to_wait_for_a_draining_worker_unless_the_user_chose() -> None:
    environ: dict[str, str] = {}
    give_workers_time_to_drain(environ, 10.0)
    assert environ == {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "15"}
    chosen = {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "60"}
    give_workers_time_to_drain(chosen, 10.0)
    assert chosen == {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "60"}
    assert drain_seconds({}) == 10.0
    assert drain_seconds({"EPISTEMIC_GRAPH_KVCACHE_DRAIN_S": "30"}) == 30.0
    assert drain_seconds({"EPISTEMIC_GRAPH_KVCACHE_DRAIN_S": "soon"}) == 10.0
