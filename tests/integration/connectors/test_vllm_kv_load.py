"""EngineKVConnector's load path (`BlockLoader`) against a real engine: values received straight
into the KV cache's blocks, the leading intact run counted, everything else a miss.

vLLM's paged KV cache is torch memory that the test venv does not have; a dict of bytes per block
stands in for it here (`write_block` is the one call the loader makes into it). The real cache
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


def test_a_value_still_arriving_at_the_deadline_is_never_written() -> None:
    """A peer that sends the head and half a valid block, then the rest after the deadline
    (a test double: a real engine cannot be made to stall mid-value)."""
    key = _keys(1)[0]
    value = encode_block(key, IDENTITY, _payload(2))
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
    head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(value)
    half = len(value) // 2

    def trickle(conn: socket.socket, stop: threading.Event) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(head + value[:half])
            stop.wait(1.5)
            with contextlib.suppress(OSError):
                conn.sendall(value[half:])

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
