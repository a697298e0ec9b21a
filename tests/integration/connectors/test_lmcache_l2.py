"""The LMCache native_plugin client against real engines (both backends).

The doubles are `counting_peer`, a loopback server that answers slowly (or with a 503) and
records how many requests it holds at once, and `garbage_peer`, which cuts a value short: no real
engine can be made to do either.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.engine.limits import MAX_VALUE_BYTES
from graph_kvcache_mcp.domain.lmcache.keys import engine_key
from graph_kvcache_mcp.domain.outcomes import Hit
from graph_kvcache_mcp.plugins.lmcache.l2 import (
    Completion,
    EngineL2Client,
    wait_for_completion,
)
from tests.support.engines import RunningEngine
from tests.support.peers import garbage_peer, loopback_peer

PAGE = 64 * 1024


def lmcache_keys(tag: str, count: int) -> list[str]:
    """Keys shaped like LMCache MP object keys: a model name with '/', fields joined by '@'."""
    salt = os.urandom(4).hex()
    return [f"Qwen/Qwen3-8B@01000100@0@{tag}{salt}{index:056x}" for index in range(count)]


def client_for(engine: RunningEngine, **params: object) -> EngineL2Client:
    return EngineL2Client(
        base_url=engine.base_url,
        token=engine.token.get_secret_value(),
        **params,  # type: ignore[arg-type]
    )


def run(client: EngineL2Client, future_id: int) -> Completion:
    completion = wait_for_completion(client, future_id, timeout_s=30)
    assert completion is not None, f"batch {future_id} did not complete within 30 s"
    return completion


def store(client: EngineL2Client, keys: list[str], pages: list[bytes]) -> Completion:
    return run(client, client.submit_batch_set(keys, [memoryview(page) for page in pages]))


def load(client: EngineL2Client, keys: list[str], size: int) -> tuple[Completion, list[bytearray]]:
    buffers = [bytearray(b"\xaa" * size) for _ in keys]
    completion = run(client, client.submit_batch_get(keys, [memoryview(b) for b in buffers]))
    return completion, buffers


def test_a_batch_set_then_get_round_trips_every_page(engine: RunningEngine) -> None:
    client = client_for(engine)
    keys = lmcache_keys("rt", 8)
    pages = [os.urandom(PAGE) for _ in keys]
    try:
        _, ok, error, results = store(client, keys, pages)
        assert (ok, error, results) == (True, "", None)
        (_, ok, error, loaded), buffers = load(client, keys, PAGE)
    finally:
        client.close()
    assert (ok, error, loaded) == (True, "", [True] * len(keys))
    assert [bytes(b) for b in buffers] == pages


def test_pages_land_under_the_documented_engine_keys(memory_engine: RunningEngine) -> None:
    client = client_for(memory_engine, namespace="fleet-a")
    keys = lmcache_keys("map", 2)
    pages = [os.urandom(1000), os.urandom(1000)]
    try:
        assert store(client, keys, pages)[1]
    finally:
        client.close()
    with memory_engine.sync_client() as kv:
        assert kv.get(engine_key(keys[0], namespace="fleet-a")) == Hit(pages[0])
        assert kv.get(engine_key(keys[1], namespace="fleet-a")) == Hit(pages[1])


def test_exists_answers_per_key_in_order(engine: RunningEngine) -> None:
    client = client_for(engine)
    present, absent = lmcache_keys("ex", 3), lmcache_keys("no", 2)
    try:
        store(client, present, [os.urandom(100) for _ in present])
        batch = [absent[0], present[0], present[1], absent[1], present[2]]
        _, ok, error, results = run(client, client.submit_batch_exists(batch))
    finally:
        client.close()
    assert (ok, error) == (True, "")
    assert results == [False, True, True, False, True]


def test_a_mixed_get_fills_hits_and_leaves_missing_buffers_untouched(
    engine: RunningEngine,
) -> None:
    client = client_for(engine)
    stored, missing = lmcache_keys("mx", 2), lmcache_keys("mxno", 2)
    pages = [os.urandom(PAGE) for _ in stored]
    try:
        store(client, stored, pages)
        batch = [stored[0], missing[0], stored[1], missing[1]]
        (_, ok, error, loaded), buffers = load(client, batch, PAGE)
    finally:
        client.close()
    assert (ok, error) == (True, ""), "a miss is an answer, not a failure"
    assert loaded == [True, False, True, False]
    assert bytes(buffers[0]) == pages[0] and bytes(buffers[2]) == pages[1]
    assert bytes(buffers[1]) == bytes(buffers[3]) == b"\xaa" * PAGE


@pytest.mark.parametrize("buffer_size", [999, 1001])
def test_a_stored_size_unlike_the_buffer_is_a_miss_that_never_writes_it(
    memory_engine: RunningEngine, buffer_size: int
) -> None:
    client = client_for(memory_engine)
    keys = lmcache_keys("size", 1)
    try:
        store(client, keys, [os.urandom(1000)])
        (_, ok, error, loaded), buffers = load(client, keys, buffer_size)
    finally:
        client.close()
    assert loaded == [False]
    assert bytes(buffers[0]) == b"\xaa" * buffer_size
    assert not ok and "1,000 bytes" in error


def test_one_block_of_another_size_in_a_batch_is_a_miss_alone(engine: RunningEngine) -> None:
    """Chunks several MiB large, as LMCache's 256-token chunks are: every good one lands whole
    in its buffer, the one stored at another size (another chunk size or layout under the same
    key) is a miss whose buffer is never written."""
    client = client_for(engine)
    size = 3 * 1024 * 1024 + 17  # not a multiple of the receive slot
    keys = lmcache_keys("big", 4)
    pages = [os.urandom(size) for _ in keys]
    pages[2] = os.urandom(size - 1)
    try:
        store(client, keys, pages)
        (_, ok, error, loaded), buffers = load(client, keys, size)
    finally:
        client.close()
    assert loaded == [True, True, False, True]
    assert [bytes(buffers[i]) for i in (0, 1, 3)] == [pages[i] for i in (0, 1, 3)]
    assert bytes(buffers[2]) == b"\xaa" * size
    assert not ok and "1 of 4 keys failed" in error and "treated as a miss" in error


def test_a_value_cut_short_by_the_peer_is_a_miss_with_a_reason() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % PAGE
    with garbage_peer(head + b"z" * (PAGE // 2)) as url:
        client = EngineL2Client(base_url=url, token="t")
        try:
            (_, ok, error, loaded), _ = load(client, lmcache_keys("cut", 2), PAGE)
        finally:
            client.close()
    assert (ok, loaded) == (False, [False, False])
    assert "2 of 2 keys failed" in error and "cut short" in error


def test_a_large_chunk_that_pauses_midway_gets_time_for_its_size() -> None:
    """A get's deadline grows with the bytes it expects, as a put's does with what it sends: a
    16 MiB chunk that stalls 0.5 s halfway still lands under a 0.2 s base timeout (16 MiB at
    the slowest rate allowed adds 2 s)."""
    size = 16 * 1024 * 1024
    value = os.urandom(size)
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % size

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(head + value[: size // 2])
            stop.wait(0.5)
            conn.sendall(value[size // 2 :])

    with loopback_peer(answer) as url:
        client = EngineL2Client(base_url=url, token="t", timeout_s=0.2)
        try:
            (_, ok, error, loaded), buffers = load(client, lmcache_keys("drip", 1), size)
        finally:
            client.close()
    assert (ok, error, loaded) == (True, "", [True])
    assert bytes(buffers[0]) == value


def test_set_captures_the_bytes_at_submit(memory_engine: RunningEngine) -> None:
    client = client_for(memory_engine)
    keys = lmcache_keys("cap", 4)
    buffers = [bytearray(os.urandom(PAGE)) for _ in keys]
    originals = [bytes(b) for b in buffers]
    try:
        future_id = client.submit_batch_set(keys, [memoryview(b) for b in buffers])
        for buffer in buffers:  # LMCache may reuse its L1 memory once the submit returned
            buffer[:] = b"\x00" * PAGE
        assert run(client, future_id)[1]
        (_, _, _, loaded), back = load(client, keys, PAGE)
    finally:
        client.close()
    assert loaded == [True] * len(keys)
    assert [bytes(b) for b in back] == originals


def test_a_repeat_set_succeeds_and_keeps_the_first_bytes(memory_engine: RunningEngine) -> None:
    client = client_for(memory_engine)
    keys = lmcache_keys("rep", 1)
    first = os.urandom(500)
    try:
        store(client, keys, [first])
        _, ok, error, _ = store(client, keys, [os.urandom(500)])
        (_, _, _, loaded), buffers = load(client, keys, 500)
    finally:
        client.close()
    assert (ok, error) == (True, ""), "already present is a successful store"
    assert loaded == [True] and bytes(buffers[0]) == first


def test_an_engine_that_is_down_gives_per_key_false_with_a_reason() -> None:
    client = EngineL2Client(base_url=f"http://127.0.0.1:{free_port()}", token="t0k3n-d0wn")
    keys = lmcache_keys("down", 3)
    try:
        _, set_ok, set_error, _ = store(client, keys, [b"x" * 10] * 3)
        (_, get_ok, get_error, loaded), buffers = load(client, keys, 10)
        _, ex_ok, ex_error, present = run(client, client.submit_batch_exists(keys))
    finally:
        client.close()
    assert (set_ok, get_ok, ex_ok) == (False, False, False)
    assert loaded == present == [False, False, False]
    assert all(bytes(b) == b"\xaa" * 10 for b in buffers)
    for error in (set_error, get_error, ex_error):
        assert "3 of 3 keys failed" in error and "not reachable" in error
        assert "t0k3n-d0wn" not in error


def test_a_wrong_token_is_refused_per_key_without_showing_the_token(
    memory_engine: RunningEngine,
) -> None:
    client = EngineL2Client(base_url=memory_engine.base_url, token="wrong-secret-value")
    keys = lmcache_keys("auth", 2)
    try:
        _, set_ok, set_error, _ = store(client, keys, [b"y" * 10] * 2)
        (_, get_ok, get_error, loaded), _ = load(client, keys, 10)
    finally:
        client.close()
    assert (set_ok, get_ok, loaded) == (False, False, [False, False])
    for error in (set_error, get_error):
        assert "401" in error
        assert "wrong-secret-value" not in error
        assert memory_engine.token.get_secret_value() not in error
    assert "wrong-secret-value" not in repr(client)


def test_a_chunk_over_the_engine_cap_fails_alone(memory_engine: RunningEngine) -> None:
    client = client_for(memory_engine)
    keys = lmcache_keys("cap", 2)
    try:
        _, ok, error, _ = store(client, keys, [b"s" * 10, bytes(MAX_VALUE_BYTES + 1)])
        (_, _, _, loaded), _ = load(client, keys[:1], 10)
    finally:
        client.close()
    assert not ok and "1 of 2 keys failed" in error and "chunk size" in error
    assert loaded == [True]


def test_close_twice_is_harmless_and_closes_the_eventfd(memory_engine: RunningEngine) -> None:
    client = client_for(memory_engine)
    fd = client.event_fd()
    client.close()
    client.close()
    assert client.closed and client.event_fd() == -1
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_submit_after_close_completes_as_refused(memory_engine: RunningEngine) -> None:
    client = client_for(memory_engine)
    client.close()
    ids = [
        client.submit_batch_set(["k@1"], [memoryview(b"abc")]),
        client.submit_batch_get(["k@1"], [memoryview(bytearray(3))]),
        client.submit_batch_exists(["k@1"]),
    ]
    drained = client.drain_completions()
    assert [c[0] for c in drained] == ids
    assert all(ok is False and "closed" in error for _, ok, error, _ in drained)
    assert client.drain_completions() == []


def test_drain_resets_the_eventfd_and_returns_nothing_when_empty(
    memory_engine: RunningEngine,
) -> None:
    client = client_for(memory_engine)
    try:
        assert client.drain_completions() == []
        future_id = client.submit_batch_exists(lmcache_keys("fd", 2))
        poller = select.poll()
        poller.register(client.event_fd(), select.POLLIN)
        deadline = time.monotonic() + 10
        while not poller.poll(100):
            assert time.monotonic() < deadline, "eventfd never became readable"
        assert [c[0] for c in client.drain_completions()] == [future_id]
        assert poller.poll(0) == [], "drain must reset the eventfd"
        assert client.drain_completions() == []
    finally:
        client.close()


def test_future_ids_are_distinct_and_increasing(memory_engine: RunningEngine) -> None:
    client = client_for(memory_engine)
    try:
        ids = [client.submit_batch_exists([f"id@{i}"]) for i in range(5)]
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(ids) and time.monotonic() < deadline:
            seen += [completion[0] for completion in client.drain_completions()]
            select.select([client.event_fd()], [], [], 0.2)
    finally:
        client.close()
    assert ids == sorted(set(ids))
    assert sorted(seen) == ids, "every batch completes exactly once"


def test_adapter_params_fall_back_to_the_environment(
    memory_engine: RunningEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", memory_engine.base_url)
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_MAX_CONNECTIONS", "3")
    client = EngineL2Client()
    keys = lmcache_keys("env", 1)
    try:
        assert store(client, keys, [b"from env"])[1:3] == (True, "")
    finally:
        client.close()
    assert client.core.base_url == memory_engine.base_url
    assert client.core.concurrency == 3


def test_without_any_setting_sixteen_requests_may_be_in_flight(
    memory_engine: RunningEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EPISTEMIC_GRAPH_KVCACHE_MAX_CONNECTIONS", raising=False)
    client = client_for(memory_engine)
    client.close()
    assert client.core.concurrency == 16


def test_addr_is_read_like_the_engine_reads_it(memory_engine: RunningEngine) -> None:
    port = memory_engine.base_url.rsplit(":", 1)[1]
    client = EngineL2Client(addr=port, token=memory_engine.token.get_secret_value())
    try:
        assert run(client, client.submit_batch_exists(["a@b"]))[1] is True
    finally:
        client.close()


def test_it_offers_every_method_lmcache_requires(memory_engine: RunningEngine) -> None:
    """The checks LMCache's native_plugin factory makes before accepting a client."""
    client = client_for(memory_engine)
    try:
        for name in (
            "event_fd",
            "submit_batch_get",
            "submit_batch_set",
            "submit_batch_exists",
            "drain_completions",
            "close",
        ):
            assert callable(getattr(client, name))
        assert isinstance(client.event_fd(), int) and client.event_fd() >= 0
    finally:
        client.close()


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_BUSY = b'{"error":"Busy","message":"try later"}'
SERVER_ERROR = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(_BUSY)}\r\nconnection: close\r\n\r\n".encode()
    + _BUSY
)


@contextmanager
def counting_peer(delay_s: float, reply: bytes = NOT_FOUND) -> Iterator[tuple[str, list[int]]]:
    """Answers every request with `reply` after `delay_s`, one thread per connection, and
    records the most requests it held at the same time (`peak[0]`)."""
    lock = threading.Lock()
    active = [0]
    peak = [0]

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        with conn:
            conn.recv(65536)
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            stop.wait(delay_s)
            with lock:
                active[0] -= 1
            with contextlib.suppress(OSError):  # the client gave up (timeout test)
                conn.sendall(reply)

    with loopback_peer(answer, backlog=64, thread_per_connection=True) as url:
        yield url, peak


def test_keys_of_one_batch_are_transferred_concurrently_within_the_bound() -> None:
    with counting_peer(delay_s=0.3) as (url, peak):
        client = EngineL2Client(base_url=url, token="t", max_connections=4)
        try:
            started = time.monotonic()
            _, ok, _, present = run(client, client.submit_batch_exists(lmcache_keys("cc", 12)))
            elapsed = time.monotonic() - started
        finally:
            client.close()
    assert ok and present == [False] * 12
    assert peak[0] == 4, f"expected 4 requests in flight at once, saw {peak[0]}"
    assert elapsed < 12 * 0.3 / 2, f"12 keys took {elapsed:.2f} s: not concurrent"


def test_a_timeout_is_a_per_key_failure_with_a_reason() -> None:
    with counting_peer(delay_s=2.0) as (url, _):
        client = EngineL2Client(base_url=url, token="t", timeout_s=0.3)
        try:
            started = time.monotonic()
            (_, ok, error, loaded), buffers = load(client, lmcache_keys("slow", 2), 10)
            elapsed = time.monotonic() - started
        finally:
            client.close()
    assert (ok, loaded) == (False, [False, False])
    assert "timed out" in error and "2 of 2 keys failed" in error
    assert all(bytes(b) == b"\xaa" * 10 for b in buffers)
    assert elapsed < 2 * 3 * 0.3 + 1.5, "retries stay bounded by the timeout"


def test_a_server_error_is_a_per_key_failure_with_the_status() -> None:
    with counting_peer(delay_s=0.0, reply=SERVER_ERROR) as (url, _):
        client = EngineL2Client(base_url=url, token="t")
        try:
            _, set_ok, set_error, _ = store(client, lmcache_keys("5xx", 1), [b"z"])
            _, ex_ok, ex_error, present = run(client, client.submit_batch_exists(["a@b"]))
        finally:
            client.close()
    assert (set_ok, ex_ok, present) == (False, False, [False])
    assert "503" in set_error and "503" in ex_error
