"""EngineKVConnector's load path (`BlockLoader`) against a real engine: values received straight
into the KV cache's blocks, the leading intact run counted, everything else a miss.

vLLM's paged KV cache is torch memory that the test venv does not have; a dict of bytes per block
stands in for it here (`write_block`: the path through a slot), or a dict of one bytearray per
layer and block (`pages_of`: the path that receives into the pages in place). The real cache
write runs in tests/integration/connectors/test_vllm_kv_connector.py on real CPU vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from graph_kvcache_mcp.connectors.engine.buffer_sink import WriteWindow
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.domain.vllm.kv_blocks import block_keys, encode_block
from graph_kvcache_mcp.plugins.vllm_kv.receive import BlockLoader
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore
from tests.support.engines import RunningEngine
from tests.support.kv_identity import kv_identity
from tests.support.peers import garbage_peer, loopback_peer, slow_peer

IDENTITY = kv_identity(head_size=16, served_model="load-test")


class DictCache:
    """Stands in for vLLM's paged KV cache: what the loader wrote, per block id."""

    def __init__(self) -> None:
        self.blocks: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def write_block(self, block_id: int, data: memoryview) -> None:
        with self._lock:
            self.blocks[block_id] = bytes(data)


class PagedCache:
    """Stands in for vLLM's CPU KV cache as host pages: one bytearray per layer and block, which
    the loader receives into in place."""

    def __init__(self) -> None:
        self.pages: dict[int, list[bytearray]] = {}
        self._lock = threading.Lock()

    def pages_of(self, block_id: int) -> list[memoryview]:
        with self._lock:
            pages = self.pages.setdefault(
                block_id, [bytearray(IDENTITY.page_bytes) for _ in range(IDENTITY.num_layers)]
            )
        return [memoryview(page) for page in pages]

    def write_block(self, block_id: int, data: memoryview) -> None:
        raise AssertionError("a load into host pages never goes through a slot")

    def block(self, block_id: int) -> bytes:
        return b"".join(self.pages[block_id])


def _in_place_loader(url: str, token: object = None, timeout_s: float = 5.0) -> BlockLoader:
    client = SyncKvClient(url, token, timeout_s=timeout_s)  # type: ignore[arg-type]
    store = EngineBlockStore(client, timeout_s=timeout_s, concurrency=4)
    cache = PagedCache()
    return BlockLoader(store, IDENTITY, cache.write_block, cache.pages_of)


def _paged(loader: BlockLoader) -> PagedCache:
    owner = loader.write_block.__self__  # type: ignore[attr-defined]
    assert isinstance(owner, PagedCache)
    return owner


def _payload(index: int) -> bytes:
    return bytes([index % 251]) * IDENTITY.block_bytes


def _keys(count: int) -> list[str]:
    return block_keys(IDENTITY.digest, list(range(count * 4)), 4, cache_salt=uuid.uuid4().hex)


def _loader(url: str, token: object = None, timeout_s: float = 5.0) -> BlockLoader:
    client = SyncKvClient(url, token, timeout_s=timeout_s)  # type: ignore[arg-type]
    store = EngineBlockStore(client, timeout_s=timeout_s, concurrency=4)
    return BlockLoader(store, IDENTITY, DictCache().write_block)


def _cache(loader: BlockLoader) -> DictCache:
    owner = loader.write_block.__self__  # type: ignore[attr-defined]
    assert isinstance(owner, DictCache)
    return owner


def test_stored_blocks_load_intact_into_their_blocks(memory_engine: RunningEngine) -> None:
    keys = _keys(40)
    values = [encode_block(key, IDENTITY, _payload(i)) for i, key in enumerate(keys)]
    with memory_engine.sync_client() as client:
        client.put_many(list(zip(keys, values, strict=True)))
    loader = _loader(memory_engine.base_url, memory_engine.token)
    try:
        block_ids = list(range(100, 140))
        result = loader.load(keys, block_ids)
        again = loader.load(keys[:3], [7, 8, 9])  # slots are reused across loads
    finally:
        loader.store.close()
    assert (result.loaded_blocks, result.failure) == (40, None)
    assert result.read_bytes == sum(len(value) for value in values)
    cache = _cache(loader).blocks
    assert all(cache[100 + i] == _payload(i) for i in range(40))
    assert again.loaded_blocks == 3 and [cache[n] for n in (7, 8, 9)] == [
        _payload(i) for i in range(3)
    ]


def _damaged(key: str, kind: str, other_key: str) -> bytes:
    if kind == "checksum":
        value = bytearray(encode_block(key, IDENTITY, _payload(1)))
        value[-5] ^= 0xFF
        return bytes(value)
    if kind == "key":
        return encode_block(other_key, IDENTITY, _payload(1))
    if kind == "identity":
        return encode_block(key, IDENTITY.model_copy(update={"served_model": "other"}), _payload(1))
    if kind == "payload":
        return encode_block(key, IDENTITY, _payload(1))[:-1]
    return b"GKVB\x01garbage that only looks like a block"


@pytest.mark.parametrize("kind", ["checksum", "key", "identity", "payload", "garbage", "missing"])
def test_a_damaged_foreign_or_missing_block_ends_the_run_and_says_why(
    memory_engine: RunningEngine, kind: str
) -> None:
    keys = _keys(6)
    items = [(key, encode_block(key, IDENTITY, _payload(i))) for i, key in enumerate(keys)]
    if kind != "missing":
        items[3] = (keys[3], _damaged(keys[3], kind, keys[4]))
    else:
        del items[3]
    with memory_engine.sync_client() as client:
        client.put_many(items)
    loader = _loader(memory_engine.base_url, memory_engine.token)
    try:
        result = loader.load(keys, list(range(6)))
    finally:
        loader.store.close()
    assert result.loaded_blocks == 3
    assert result.failure is not None and result.failure[0] == keys[3]
    words = {
        "missing": "not in the engine",
        "garbage": "cannot hold a block",
        "payload": "does not hold one block",
    }
    assert words.get(kind, kind) in result.failure[1]
    cache = _cache(loader).blocks
    assert [cache[i] for i in range(3)] == [_payload(i) for i in range(3)]
    assert 3 not in cache  # a block that failed its checks never reaches the cache


def test_values_written_before_crc32_with_a_sha256_still_load(
    memory_engine: RunningEngine,
) -> None:
    key = _keys(1)[0]
    payload = _payload(9)
    header = json.dumps(
        {
            "dtype": IDENTITY.dtype,
            "identity": IDENTITY.digest,
            "key": key,
            "layout": IDENTITY.layout,
            "payload_bytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "shape": [IDENTITY.num_layers, IDENTITY.page_bytes],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    value = b"GKVB\x01" + len(header).to_bytes(4, "big") + header + payload
    with memory_engine.sync_client() as client:
        client.put(key, value)
    loader = _loader(memory_engine.base_url, memory_engine.token)
    try:
        result = loader.load([key], [0])
    finally:
        loader.store.close()
    assert (result.loaded_blocks, _cache(loader).blocks[0]) == (1, payload)


def test_a_hung_or_garbled_engine_is_a_miss_within_the_timeout() -> None:
    keys = _keys(8)
    with slow_peer(hold_s=10.0) as url:
        loader = _loader(url, timeout_s=0.5)
        try:
            began = time.monotonic()
            hung = loader.load(keys, list(range(8)))
            took = time.monotonic() - began
        finally:
            loader.store.close(flush_timeout_s=0.1)
    with garbage_peer() as url:
        garbled_loader = _loader(url)
        try:
            garbled = garbled_loader.load(keys, list(range(8)))
        finally:
            garbled_loader.store.close(flush_timeout_s=0.1)
    assert hung.loaded_blocks == 0 and hung.failure is not None
    assert took < 2.0  # the KV timeout bounds the whole load
    assert garbled.loaded_blocks == 0 and garbled.failure is not None
    assert not _cache(loader).blocks and not _cache(garbled_loader).blocks


def _half_then_late(value: bytes, half: int) -> Callable[[socket.socket, threading.Event], None]:
    """A peer's handler: the head and `value[:half]` at once, the rest 1.5 s later."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
    head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(value)

    def trickle(conn: socket.socket, stop: threading.Event) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(head + value[:half])
            stop.wait(1.5)
            with contextlib.suppress(OSError):
                conn.sendall(value[half:])

    return trickle


def test_a_value_still_arriving_at_the_deadline_is_never_written() -> None:
    """A peer that sends the head and half a valid block, then the rest after the deadline
    (a test double: a real engine cannot be made to stall mid-value)."""
    key = _keys(1)[0]
    value = encode_block(key, IDENTITY, _payload(2))
    half = len(value) // 2
    trickle = _half_then_late(value, half)

    with loopback_peer(trickle, thread_per_connection=True) as url:
        loader = _loader(url, timeout_s=0.5)
        try:
            result = loader.load([key], [0])
            time.sleep(1.5)  # the rest arrives now; nothing may write it into the cache
        finally:
            loader.store.close(flush_timeout_s=0.1)
    assert result.loaded_blocks == 0 and result.failure is not None
    assert not _cache(loader).blocks


def test_a_closed_load_window_admits_no_writer_and_waits_for_the_one_inside() -> None:
    window = WriteWindow()
    assert window.enter()
    closed = threading.Event()

    def close() -> None:
        window.close()
        closed.set()

    closer = threading.Thread(target=close)
    closer.start()
    assert not closed.wait(0.2)  # a copy under way holds the load open
    window.leave()
    closer.join(timeout=5)
    assert closed.is_set() and not window.enter()


def test_stored_blocks_load_in_place_into_their_pages(memory_engine: RunningEngine) -> None:
    keys = _keys(24)
    values = [encode_block(key, IDENTITY, _payload(i)) for i, key in enumerate(keys)]
    with memory_engine.sync_client() as client:
        client.put_many(list(zip(keys, values, strict=True)))
    loader = _in_place_loader(memory_engine.base_url, memory_engine.token)
    try:
        result = loader.load(keys, list(range(50, 74)))
    finally:
        loader.store.close()
    assert (result.loaded_blocks, result.failure) == (24, None)
    assert result.read_bytes == sum(len(value) for value in values)
    cache = _paged(loader)
    assert all(cache.block(50 + i) == _payload(i) for i in range(24))


@pytest.mark.parametrize("kind", ["checksum", "key"])
def test_a_block_received_in_place_that_fails_its_checks_is_not_counted(
    memory_engine: RunningEngine, kind: str
) -> None:
    """A damaged payload is already in its pages when its checksum fails: the block is reported
    as not loaded (vLLM recomputes it, overwriting it); a foreign value never reaches them."""
    keys = _keys(5)
    items = [(key, encode_block(key, IDENTITY, _payload(i))) for i, key in enumerate(keys)]
    items[2] = (keys[2], _damaged(keys[2], kind, keys[3]))
    with memory_engine.sync_client() as client:
        client.put_many(items)
    loader = _in_place_loader(memory_engine.base_url, memory_engine.token)
    try:
        result = loader.load(keys, list(range(5)))
    finally:
        loader.store.close()
    assert result.loaded_blocks == 2
    assert result.failure is not None and result.failure[0] == keys[2]
    assert kind in result.failure[1]
    cache = _paged(loader)
    assert [cache.block(i) for i in range(2)] == [_payload(i) for i in range(2)]
    if kind == "key":
        assert cache.block(2) == bytes(IDENTITY.block_bytes)


def test_a_value_arriving_in_place_at_the_deadline_ends_with_the_load() -> None:
    """A peer that sends the head and half a valid block, then the rest after the deadline
    (a test double: a real engine cannot be made to stall mid-value). The receiver holds the
    load's window while it receives into the pages: the timeout must release it (the load
    returns within its bound), and nothing arrives in the pages after the load returned."""
    key = _keys(1)[0]
    value = encode_block(key, IDENTITY, _payload(2))
    half = len(value) // 2
    trickle = _half_then_late(value, half)

    with loopback_peer(trickle, thread_per_connection=True) as url:
        loader = _in_place_loader(url, timeout_s=0.5)
        try:
            began = time.monotonic()
            result = loader.load([key], [0])
            took = time.monotonic() - began
            seen = _paged(loader).block(0)
            time.sleep(1.5)  # the rest arrives now; nothing may write it into the pages
        finally:
            loader.store.close(flush_timeout_s=0.1)
    assert result.loaded_blocks == 0 and result.failure is not None
    assert took < 5.0  # the 0.5 s KV timeout bounds the load, window included
    assert _paged(loader).block(0) == seen
    assert seen.endswith(bytes(IDENTITY.block_bytes - (half - (len(value) - len(_payload(2))))))
