"""One deadline bounds a KV call even when the engine has to be started again under it.

The restart is held up for real: another holder of the engine's lifecycle lock (as a CLI
`engine start` or `engine stop` in another shell would be) keeps it from finishing, so the
calls that meet it must answer within their own deadline and leave the restart running.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from pathlib import Path

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.managed_access import ManagedKvAccess
from graph_kvcache_mcp.domain.outcomes import Hit, Unavailable
from tests.support.processes import engine_gone, wait_until

TIMEOUT_S = 2.0
SLACK_S = 3.0
"""A generous bound on what a call may take past its deadline (scheduling on a loaded host)."""
HELD_S = 25.0
"""How long the lock is held at most: today's code would wait all of it."""


async def test_calls_during_a_held_up_restart_answer_within_their_deadline(
    tmp_path: Path,
) -> None:
    settings = Settings.build(data_dir=tmp_path, kv_timeout_s=TIMEOUT_S, engine_backend="durable")
    access = ManagedKvAccess(settings)
    try:
        await access.start_engine()  # waits for the first start, however long it takes
        first = await access.connect()
        assert not isinstance(first, Unavailable), first
        await first.put("restart:key", b"kept across the restart")
        state = access.engine.running_state()
        assert state is not None
        with (tmp_path / "engine" / "lifecycle.lock").open("ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            released = threading.Timer(HELD_S, fcntl.flock, (lock, fcntl.LOCK_UN))
            released.start()
            try:
                os.kill(state.process.pid, signal.SIGKILL)
                wait_until(lambda: engine_gone(state), timeout_s=10, what="the engine to die")
                took: list[float] = []
                answers: list[object] = []

                async def call() -> None:
                    began = time.monotonic()
                    kv = await access.connect()
                    answers.append(kv if isinstance(kv, Unavailable) else await kv.get("x"))
                    took.append(time.monotonic() - began)

                async with anyio.create_task_group() as group:
                    for _ in range(3):
                        group.start_soon(call)
            finally:
                released.cancel()
                fcntl.flock(lock, fcntl.LOCK_UN)
        assert max(took) < TIMEOUT_S + SLACK_S, took
        assert all(isinstance(answer, Unavailable) for answer in answers), answers
        reasons = [answer.reason for answer in answers if isinstance(answer, Unavailable)]
        assert all(reason.startswith("engine restarting") for reason in reasons), reasons

        async def healed() -> Hit[bytes]:
            while True:
                kv = await access.connect()
                if not isinstance(kv, Unavailable):
                    got = await kv.get("restart:key")
                    assert isinstance(got, Hit), got
                    return got
                assert kv.reason.startswith("engine restarting"), kv.reason
                await anyio.sleep(0.2)

        with anyio.fail_after(60):
            got = await healed()
        assert got.value == b"kept across the restart"
        assert access.info().restarts == 1
    finally:
        await access.aclose()
