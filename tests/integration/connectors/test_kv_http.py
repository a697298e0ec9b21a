"""The KV client against real engines (both backends)."""

from __future__ import annotations

import os
import secrets
import signal
import threading

import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.connectors.processes.control import wait_gone
from graph_kvcache_mcp.domain.engine.limits import MAX_VALUE_BYTES
from graph_kvcache_mcp.domain.outcomes import Hit, Miss, Presence, Stored, Unavailable
from graph_kvcache_mcp.errors import InvalidKey, InvalidValue
from tests.support.engines import RunningEngine


def _key(prefix: str = "t") -> str:
    return f"{prefix}:{secrets.token_hex(8)}"


async def test_put_then_get_round_trips_exact_bytes(engine: RunningEngine) -> None:
    client = engine.client()
    key, value = _key(), secrets.token_bytes(256 * 1024)
    assert await client.put(key, value) == Stored("stored_new")
    assert await client.get(key) == Hit(value)
    assert await client.get(_key("absent")) == Miss()


async def test_repeat_put_keeps_the_first_value_and_says_so(engine: RunningEngine) -> None:
    client = engine.client()
    key = _key()
    await client.put(key, b"first")
    assert await client.put(key, b"second") == Stored("already_present")
    assert await client.get(key) == Hit(b"first")


async def test_contains_and_exists_agree(engine: RunningEngine) -> None:
    client = engine.client()
    key = _key()
    await client.put(key, b"x")
    assert await client.contains(key) == Presence(True)
    assert await client.exists(key) == Presence(True)
    absent = _key("absent")
    assert await client.contains(absent) == Presence(False)
    assert await client.exists(absent) == Presence(False)


async def test_batches_keep_input_order_and_type_each_result(engine: RunningEngine) -> None:
    client = engine.client()
    items = [(_key(), secrets.token_bytes(1024 + i)) for i in range(40)]
    stored = await client.put_many(items)
    assert stored == [Stored("stored_new")] * len(items)
    keys = [k for k, _ in items] + [_key("absent")]
    got = await client.get_many(keys)
    assert got[:-1] == [Hit(v) for _, v in items]
    assert got[-1] == Miss()
    assert await client.contains_many(keys) == [Presence(True)] * len(items) + [Presence(False)]


async def test_keys_with_slashes_and_colons_are_stored_raw(engine: RunningEngine) -> None:
    client = engine.client()
    key = f"model/a@b/{secrets.token_hex(4)}:chunk"
    await client.put(key, b"raw")
    assert await client.get(key) == Hit(b"raw")
    assert await client.get(key.replace("/", "%2F")) == Miss()


async def test_stats_are_normalized_per_backend(engine: RunningEngine) -> None:
    client = engine.client()
    await client.put(_key(), b"abc")
    await client.get(_key("absent"))
    report = await client.stats()
    assert not isinstance(report, Unavailable)
    assert report.engine.backend == engine.backend
    if engine.backend == "memory":
        assert report.engine.unique_blocks and report.engine.unique_blocks >= 1
        assert report.engine.get_hits is None  # the memory backend never counts gets
        assert report.hit_rate_source == "client"
    else:
        assert report.engine.put_new and report.engine.put_new >= 1
        assert report.engine.resident_bytes is None
        assert report.engine.get_misses and report.engine.get_misses >= 1
    assert report.client.gets == 1 and report.client.get_misses == 1


async def test_invalid_keys_and_oversize_values_fail_before_any_io(engine: RunningEngine) -> None:
    client = engine.client()
    with pytest.raises(InvalidKey):
        await client.put("bad key", b"x")
    with pytest.raises(InvalidKey):
        await client.get_many(["fine", "stats"])
    key = _key()
    with pytest.raises(InvalidValue, match="64 MiB"):
        await client.put(key, b"\0" * (MAX_VALUE_BYTES + 1))
    assert await client.contains(key) == Presence(False)
    assert client.counters().puts == 0


async def test_wrong_token_is_unavailable_401_naming_the_setting(engine: RunningEngine) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    client = KvClient.connect(engine.base_url, SecretStr(wrong))
    outcome = await client.get("k")
    assert isinstance(outcome, Unavailable) and outcome.status == 401
    assert "EPISTEMIC_GRAPH_KVCACHE_TOKEN" in outcome.reason
    assert wrong not in outcome.reason and wrong not in repr(client)
    stats = await client.stats()
    assert isinstance(stats, Unavailable) and stats.status == 401


async def test_a_stopped_engine_is_unavailable_never_a_miss(own_engine: RunningEngine) -> None:
    client = own_engine.client()
    await client.put("k1", b"v")
    own_engine.managed.stop()
    for outcome in (await client.get("k1"), await client.contains("k1"), await client.stats()):
        assert isinstance(outcome, Unavailable)
        assert "not reachable" in outcome.reason
        assert own_engine.token.get_secret_value() not in outcome.reason


def test_sigkill_mid_batch_gives_typed_partial_results(own_engine: RunningEngine) -> None:
    items = [(f"blk:{i}", secrets.token_bytes(256 * 1024)) for i in range(400)]
    state = own_engine.managed.running_state()
    assert state is not None
    client = SyncKvClient(own_engine.base_url, own_engine.token, timeout_s=2.0, concurrency=4)
    killer = threading.Timer(0.05, os.kill, args=(state.process.pid, signal.SIGKILL))
    killer.start()
    results = client.put_many(items)
    killer.join()
    client.close()
    assert len(results) == len(items)
    assert all(isinstance(r, Stored | Unavailable) for r in results)
    assert any(isinstance(r, Unavailable) for r in results)


def test_acknowledged_puts_survive_sigkill_and_restart(own_engine: RunningEngine) -> None:
    items = [(f"durable:{i}", secrets.token_bytes(4096)) for i in range(50)]
    with own_engine.sync_client() as client:
        assert all(isinstance(r, Stored) for r in client.put_many(items))
    state = own_engine.managed.running_state()
    assert state is not None
    os.kill(state.process.pid, signal.SIGKILL)
    assert wait_gone(state.process.pid, timeout_s=10)
    own_engine.managed.start(backend="durable", port=state.port)
    # An engine started after an unclean stop has a new token (the old one may have leaked).
    assert own_engine.managed.token() != own_engine.token
    with SyncKvClient(own_engine.base_url, own_engine.managed.token()) as client:
        assert client.get_many([k for k, _ in items]) == [Hit(v) for _, v in items]
