"""One deadline per call, against a real engine made to hang with SIGSTOP.

A stopped engine still accepts connections (the kernel queues them in the listen backlog) but never
answers: the worst case for a client. The bounds asserted here are correctness bounds (timeout plus
one second), not benchmarks.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import anyio.to_thread
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.domain.outcomes import Hit, Presence, Unavailable
from graph_kvcache_mcp.server import build_server
from tests.support.engines import RunningEngine
from tests.support.processes import wait_until

TIMEOUT_S = 2.0
BOUND_S = TIMEOUT_S + 1.0


@contextmanager
def hung(engine: RunningEngine) -> Iterator[None]:
    """The engine stopped (SIGSTOP) for the block and continued (SIGCONT) after it, always."""
    state = engine.managed.running_state()
    assert state is not None
    os.kill(state.process.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: _stopped(state.process.pid), timeout_s=5, what="the engine to stop")
        yield
    finally:
        os.kill(state.process.pid, signal.SIGCONT)


def _stopped(pid: int) -> bool:
    """SIGSTOP is delivered asynchronously: wait for the kernel to report the state (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def connections_to(engine: RunningEngine) -> int:
    """Open client connections to the engine's port (Linux: /proc/net/tcp, state ESTABLISHED)."""
    port = f"{int(engine.base_url.rsplit(':', 1)[1]):04X}"
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if row[2].endswith(":" + port) and row[3] == "01")


def wait_for_connections(engine: RunningEngine, at_least: int) -> None:
    wait_until(
        lambda: connections_to(engine) >= at_least, timeout_s=5, what="the batch to hold its lanes"
    )


def _timed_out(outcome: object) -> bool:
    return isinstance(outcome, Unavailable) and f"timed out after {TIMEOUT_S:g} s" in outcome.reason


async def test_a_hung_engine_answers_one_key_and_a_batch_within_the_deadline(
    own_engine: RunningEngine,
) -> None:
    client = KvClient(own_engine.sync_client(timeout_s=TIMEOUT_S))
    keys = [f"hung:{secrets.token_hex(4)}" for _ in range(9)]
    assert await client.put(keys[0], b"v") is not None
    with hung(own_engine):
        started = time.monotonic()
        one = await client.get(keys[0])
        one_s = time.monotonic() - started
        started = time.monotonic()
        batch = await client.contains_many(keys)
        batch_s = time.monotonic() - started
    assert _timed_out(one) and one_s < BOUND_S, (one, one_s)
    assert all(_timed_out(outcome) for outcome in batch) and batch_s < BOUND_S, (batch, batch_s)
    assert client.counters().retries == 0
    with anyio.fail_after(10):
        assert await client.get(keys[0]) == Hit(b"v")


async def test_kv_get_and_kv_exists_answer_unreachable_within_the_timeout_on_a_hung_engine(
    own_engine: RunningEngine,
) -> None:
    """The tools an agent calls: one key and nine keys, each answered within the timeout plus a
    second, and reads hit again once the engine continues."""
    settings = Settings.build(
        kv_url=own_engine.base_url,
        kv_token=own_engine.token,
        data_dir=own_engine.managed.data_dir,
        kv_timeout_s=TIMEOUT_S,
    )
    keys = [f"tool:{i}:{secrets.token_hex(4)}" for i in range(9)]
    async with Client(build_server(settings)) as client:
        await client.call_tool("kv_put", {"key": keys[0], "value_b64": "dg=="})
        with hung(own_engine):
            for tool, arguments in [("kv_get", {"keys": keys[:1]}), ("kv_exists", {"keys": keys})]:
                started = time.monotonic()
                result = await client.call_tool(tool, arguments)
                elapsed_s = time.monotonic() - started
                out = result.structured_content or {}
                assert out["reachable"] is False and elapsed_s < BOUND_S, (tool, elapsed_s)
                assert all(_timed_out(Unavailable(r["reason"])) for r in out["results"]), out
        with anyio.fail_after(10):
            result = await client.call_tool("kv_get", {"keys": keys[:1]})
        assert (result.structured_content or {})["results"][0]["hit"] is True


def test_the_blocking_client_keeps_the_same_deadline_against_a_hung_engine(
    own_engine: RunningEngine,
) -> None:
    keys = [f"hung:{secrets.token_hex(4)}" for _ in range(9)]
    with own_engine.sync_client(timeout_s=TIMEOUT_S) as client:
        client.put(keys[0], b"v")
        with hung(own_engine):
            started = time.monotonic()
            one = client.get(keys[0])
            one_s = time.monotonic() - started
            started = time.monotonic()
            batch = client.get_many(keys)
            batch_s = time.monotonic() - started
        assert _timed_out(one) and one_s < BOUND_S, (one, one_s)
        assert all(_timed_out(outcome) for outcome in batch) and batch_s < BOUND_S
        assert client.get(keys[0]) == Hit(b"v")


async def test_a_caller_stuck_on_a_hung_batch_holds_no_other_caller_past_its_deadline(
    own_engine: RunningEngine,
) -> None:
    """A 64-key batch fills every lane it may use; a second call on the same client still answers
    by its own deadline (it used to queue behind the batch's requests)."""
    client = KvClient(own_engine.sync_client(timeout_s=TIMEOUT_S, concurrency=4))
    key = f"fair:{secrets.token_hex(4)}"
    await client.put(key, b"v")
    many = [f"fair:{i}" for i in range(64)]
    other: list[tuple[object, float]] = []

    async def second_caller() -> None:
        await anyio.to_thread.run_sync(wait_for_connections, own_engine, 4)
        started = time.monotonic()
        other.append((await client.contains(key), time.monotonic() - started))

    with hung(own_engine):
        async with anyio.create_task_group() as group:
            group.start_soon(client.contains_many, many)
            group.start_soon(second_caller)
    [(outcome, elapsed_s)] = other
    assert _timed_out(outcome) and elapsed_s < BOUND_S, (outcome, elapsed_s)
    with anyio.fail_after(10):
        assert await client.contains(key) == Presence(True)


def test_threads_sharing_a_blocking_client_each_keep_their_own_deadline(
    own_engine: RunningEngine,
) -> None:
    with own_engine.sync_client(timeout_s=TIMEOUT_S, concurrency=4) as client:
        batch_results: list[object] = []
        batch = threading.Thread(
            target=lambda: batch_results.extend(client.contains_many([f"f:{i}" for i in range(64)]))
        )
        with hung(own_engine):
            batch.start()
            wait_for_connections(own_engine, 4)
            started = time.monotonic()
            outcome = client.contains("fair:x")
            elapsed_s = time.monotonic() - started
            batch.join(timeout=BOUND_S + 1)
        assert len(batch_results) == 64 and all(map(_timed_out, batch_results))
        assert _timed_out(outcome) and elapsed_s < BOUND_S, (outcome, elapsed_s)


def test_a_refused_connection_is_retried_within_the_deadline(own_engine: RunningEngine) -> None:
    """Nothing was sent, so even a PUT may be sent again; the call still ends as not reachable."""
    client = SyncKvClient(own_engine.base_url, own_engine.token, timeout_s=TIMEOUT_S)
    own_engine.managed.stop()
    started = time.monotonic()
    outcome = client.put("k", b"v")
    assert isinstance(outcome, Unavailable) and "not reachable" in outcome.reason
    assert client.counters().retries == 2
    assert time.monotonic() - started < BOUND_S
