"""An engine the user started with `engine start` (runs until `engine stop`) keeps that lifetime
when a session heals it after a crash: the session does not come to own it and stop it on exit
(#39 item 8). A real managed engine, killed for real."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.engine.managed_access import ManagedKvAccess
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.domain.outcomes import Unavailable
from tests.support.processes import engine_gone, wait_until


async def test_a_healed_engine_keeps_the_run_until_stop_lifetime_the_user_gave_it(
    tmp_path: Path,
) -> None:
    engine = ManagedEngine(tmp_path)
    engine.start(backend="memory", runs_until_stop=True)  # as `engine start` does
    try:
        settings = Settings.build(data_dir=tmp_path, kv_timeout_s=30.0)
        access = ManagedKvAccess(settings)
        try:
            first = await access.connect()
            assert not isinstance(first, Unavailable), first
            lost = engine.running_state()
            assert lost is not None and lost.runs_until_stop
            os.kill(lost.process.pid, signal.SIGKILL)
            wait_until(lambda: engine_gone(lost), timeout_s=10, what="the engine to die")

            async def heal() -> KvClient:
                while True:
                    kv = await access.connect()
                    if not isinstance(kv, Unavailable):
                        return kv
                    await anyio.sleep(0.2)

            with anyio.fail_after(90):
                healed = await heal()
            assert not isinstance(await healed.engine_stats(), Unavailable)
            again = engine.running_state()
            assert again is not None and again.process.pid != lost.process.pid
            assert again.runs_until_stop
            assert access.info().stops_on_exit is False
        finally:
            await access.aclose()
        after = engine.running_state()
        assert after is not None and after.process.pid == again.process.pid  # still runs
    finally:
        engine.stop()
