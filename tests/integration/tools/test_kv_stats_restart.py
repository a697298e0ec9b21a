"""kv_stats says why a field is null and when the engine restarted, against a real managed
engine stopped and started again (the durable backend reports no occupancy fields, and its
counters start over at each start), and the CLI prints the same note."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.kv.views import KvStatsOut
from tests.support.mcp_calls import b64, call_ok, fresh_key


@contextmanager
def _stopped_afterwards(data_dir: Path) -> Iterator[None]:
    try:
        yield
    finally:
        ManagedEngine(data_dir).stop(term_wait_s=5.0)


async def _stats(client: Client, **since: str) -> KvStatsOut:
    return KvStatsOut.model_validate(await call_ok(client, "kv_stats", dict(since)))


async def test_kv_stats_after_an_engine_restart_says_why_unique_blocks_is_null(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings.build(data_dir=tmp_path, engine_backend="durable")
    with _stopped_afterwards(tmp_path):
        async with Client(build_server(settings)) as client:
            await call_ok(client, "kv_put", {"key": fresh_key(), "value_b64": b64(b"before")})
            before = await _stats(client)
            await call_ok(client, "engine_stop", {"force": True})
            await call_ok(client, "engine_start", {"backend": "durable"})
            after = await _stats(client, since=before.snapshot_id or "")
            # while this session keeps the engine up; the CLI runs its own event loop
            argv = ["kv", "stats", "--data-dir", str(tmp_path)]
            code = await anyio.to_thread.run_sync(main, argv)
        printed = capsys.readouterr().out
    assert before.engine is not None and before.engine.put_new == 1
    assert after.engine is not None and after.engine.unique_blocks is None
    assert after.engine.put_new == 0  # the durable backend's counters start over
    assert before.note is not None and after.note is not None
    unreported = "null = not reported by the durable backend: unique_blocks, total_refs"
    assert unreported in before.note and unreported in after.note
    assert "restarted" not in before.note
    assert "the engine restarted after the `since` snapshot" in after.note
    assert code == 0 and f"note: {unreported}" in printed


async def test_kv_stats_on_the_memory_backend_names_what_it_does_not_count(
    tmp_path: Path,
) -> None:
    settings = Settings.build(data_dir=tmp_path, engine_backend="memory")
    with _stopped_afterwards(tmp_path):
        async with Client(build_server(settings)) as client:
            stats = await _stats(client)
    assert stats.engine is not None and stats.engine.unique_blocks == 0
    assert stats.note is not None
    assert "not reported by the memory backend: put_new, get_hits, get_misses" in stats.note
