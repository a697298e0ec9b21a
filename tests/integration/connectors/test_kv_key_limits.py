"""The engine's real key limits, per backend, and the client refusing longer keys before sending."""

from __future__ import annotations

import secrets
import socket

import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target
from graph_kvcache_mcp.connectors.engine.wire import Deadline
from graph_kvcache_mcp.domain.engine.limits import (
    KV_ROUTE_PREFIX,
    MAX_KEY_BYTES,
    MAX_REQUEST_TARGET_BYTES,
)
from graph_kvcache_mcp.domain.outcomes import Hit, Presence, Stored, Unavailable
from graph_kvcache_mcp.errors import InvalidKey
from tests.support.engines import RunningEngine

REFUSED_WITHOUT_OUR_CHECK = {"memory": 400, "durable": 500}
"""What the engine itself answers to a PUT of a key one byte over its backend's limit."""


def _key_of(size: int) -> str:
    return (f"long:{secrets.token_hex(8)}:" + "k" * size)[:size]


def test_a_binary_search_on_the_real_engine_finds_each_backends_key_limit(
    engine: RunningEngine,
) -> None:
    """Measures the figure domain/engine/limits.py records, bypassing the client's own check: the
    longest key a fresh PUT stores and a GET returns, searched over every length the request target
    allows; one byte more is refused by the engine itself (400 memory, 500 durable)."""
    with engine.sync_client() as client:

        def raw(method: str, key: str, body: bytes | None = None) -> int:
            path = KV_ROUTE_PREFIX + key
            return client.wire.exchange(method, path, body, deadline=Deadline.after(10)).status

        def round_trips(size: int) -> bool:
            key = _key_of(size)
            return raw("PUT", key, b"v") in (200, 201) and raw("GET", key) == 200

        stored, refused = 1, MAX_REQUEST_TARGET_BYTES  # invariant: stored works, refused fails
        assert round_trips(stored) and not round_trips(refused)
        while refused - stored > 1:
            middle = (stored + refused) // 2
            stored, refused = (middle, refused) if round_trips(middle) else (stored, middle)
        assert stored == MAX_KEY_BYTES[engine.backend]
        assert raw("PUT", _key_of(stored + 1), b"v") == REFUSED_WITHOUT_OUR_CHECK[engine.backend]


def test_a_key_over_the_backend_limit_is_refused_before_its_request_naming_the_backend(
    engine: RunningEngine,
) -> None:
    """The client does not know the backend up front: it learns it from /kv/stats."""
    limit = MAX_KEY_BYTES[engine.backend]
    with engine.sync_client() as client:
        longest = _key_of(limit)
        assert client.put(longest, b"v") == Stored("stored_new")
        assert client.get(longest) == Hit(b"v")
        with pytest.raises(InvalidKey, match=f"{engine.backend} backend") as caught:
            client.put(_key_of(limit + 1), b"v")
        assert client.backend == engine.backend
        assert caught.value.rule == "length" and f"at most {limit} bytes" in str(caught.value)
        assert (client.counters().puts, client.counters().errors) == (1, 0)


async def test_the_async_client_learns_the_backend_and_refuses_the_same_keys(
    engine: RunningEngine,
) -> None:
    limit = MAX_KEY_BYTES[engine.backend]
    client = engine.client()
    assert await client.contains(_key_of(limit)) == Presence(False)
    with pytest.raises(InvalidKey, match=f"{engine.backend} backend"):
        await client.get_many(["short", _key_of(limit + 1)])
    assert client.core.backend == engine.backend


def _refusing_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_a_client_told_its_backend_refuses_a_long_key_without_any_io() -> None:
    with SyncKvClient(_refusing_url(), None, backend="durable") as client:
        with pytest.raises(InvalidKey, match="durable backend"):
            client.put(_key_of(MAX_KEY_BYTES["durable"] + 1), b"v")
        assert client.counters().errors == 0


def test_a_long_key_for_an_engine_that_cannot_say_its_backend_is_unavailable() -> None:
    with SyncKvClient(_refusing_url(), None, timeout_s=1.0) as client:
        outcome = client.get(_key_of(MAX_KEY_BYTES["durable"] + 1))
    assert isinstance(outcome, Unavailable) and "not reachable" in outcome.reason


def test_the_managed_engine_target_carries_its_backend(memory_engine: RunningEngine) -> None:
    settings = Settings.build(data_dir=memory_engine.managed.data_dir)
    target = resolve_kv_target(settings)
    assert (target.source, target.backend) == ("managed", "memory")
