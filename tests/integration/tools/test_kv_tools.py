"""kv_* tools through an in-memory MCP Client, against real engines (both backends, both eras)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.kv.probe import KvProbeOut
from graph_kvcache_mcp.services.kv.views import (
    KvExistsOut,
    KvGetManyOut,
    KvGetOut,
    KvPutOut,
    KvStatsOut,
)
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import MODES, b64, call_error, call_ok, fresh_key


@MODES
async def test_kv_put_stores_new_bytes_and_a_repeat_put_keeps_the_first_value(
    engine: RunningEngine, mode: str
) -> None:
    key, first, second = fresh_key(), os.urandom(100), os.urandom(100)
    async with Client(build_server(engine.settings), mode=mode) as client:
        stored = KvPutOut.model_validate(
            await call_ok(client, "kv_put", {"key": key, "value_b64": b64(first)})
        )
        repeat = KvPutOut.model_validate(
            await call_ok(client, "kv_put", {"key": key, "value_b64": b64(second)})
        )
        got = KvGetManyOut.model_validate(
            await call_ok(client, "kv_get", {"keys": [key], "include_value": True})
        )
    assert (stored.state, stored.stored_new, stored.note) == ("stored_new", True, None)
    assert stored.size_bytes == 100 and stored.sha256 == hashlib.sha256(first).hexdigest()
    assert (repeat.state, repeat.stored_new) == ("already_present", False)
    assert repeat.note is not None and "first value" in repeat.note
    assert base64.b64decode(got.results[0].value_b64 or "") == first


@MODES
async def test_kv_get_reports_size_and_digest_and_returns_bytes_only_when_asked(
    engine: RunningEngine, mode: str
) -> None:
    key, missing, value = fresh_key(), fresh_key("absent"), b"some bytes"
    engine.sync_client().put(key, value)
    async with Client(build_server(engine.settings), mode=mode) as client:
        plain = KvGetManyOut.model_validate(
            await call_ok(client, "kv_get", {"keys": [key, missing]})
        )
        with_value = KvGetManyOut.model_validate(
            await call_ok(client, "kv_get", {"keys": [key], "include_value": True})
        )
    hit, miss = plain.results
    assert (hit.key, hit.hit, hit.size_bytes, hit.value_b64) == (key, True, len(value), None)
    assert hit.sha256 == hashlib.sha256(value).hexdigest()
    assert (miss.key, miss.reachable, miss.hit) == (missing, True, False)
    assert (plain.hits, plain.misses, plain.reachable) == (1, 1, True)
    assert with_value.results[0].value_b64 == b64(value)
    assert with_value.inline_bytes == len(value)


@MODES
async def test_kv_get_inlines_values_only_while_the_response_stays_under_the_cap(
    engine: RunningEngine, mode: str
) -> None:
    first, second = fresh_key(), fresh_key()
    engine.sync_client().put(first, os.urandom(3000))
    engine.sync_client().put(second, os.urandom(3000))
    arguments = {"keys": [first, second], "include_value": True, "max_inline_bytes": 4000}
    async with Client(build_server(engine.settings), mode=mode) as client:
        out = KvGetManyOut.model_validate(await call_ok(client, "kv_get", arguments))
    inline, over = out.results
    assert inline.value_b64 is not None and inline.note is None
    assert over.value_b64 is None and over.hit and over.size_bytes == 3000
    assert over.note is not None and "kv_save" in over.note
    assert out.inline_bytes == 3000


@MODES
async def test_kv_save_writes_the_value_to_a_new_file_and_never_overwrites(
    engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    key, value = fresh_key(), os.urandom(200_000)
    engine.sync_client().put(key, value)
    target = tmp_path / "value.bin"
    settings = engine.settings.model_copy(update={"file_roots": (tmp_path,)})
    async with Client(build_server(settings), mode=mode) as client:
        saved = KvGetOut.model_validate(
            await call_ok(client, "kv_save", {"key": key, "path": str(target)})
        )
        again = await call_error(client, "kv_save", {"key": key, "path": str(target)})
        relative = await call_error(client, "kv_save", {"key": key, "path": "value.bin"})
    assert (saved.hit, saved.saved_to, saved.size_bytes) == (True, str(target), len(value))
    assert target.read_bytes() == value
    assert "already exists" in again and "choose a new path" in again
    assert "relative" in relative


@MODES
async def test_kv_save_writes_nothing_for_a_missing_key(
    engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    target = tmp_path / "nothing.bin"
    settings = engine.settings.model_copy(update={"file_roots": (tmp_path,)})
    async with Client(build_server(settings), mode=mode) as client:
        out = KvGetOut.model_validate(
            await call_ok(client, "kv_save", {"key": fresh_key(), "path": str(target)})
        )
    assert (out.reachable, out.hit, out.saved_to) == (True, False, None)
    assert not target.exists()


@MODES
async def test_kv_put_reads_the_value_from_a_file_path(
    engine: RunningEngine, mode: str, tmp_path: Path
) -> None:
    key, value = fresh_key(), os.urandom(5000)
    source = tmp_path / "block.bin"
    source.write_bytes(value)
    settings = engine.settings.model_copy(update={"file_roots": (tmp_path,)})
    async with Client(build_server(settings), mode=mode) as client:
        out = KvPutOut.model_validate(
            await call_ok(client, "kv_put", {"key": key, "file_path": str(source)})
        )
    got = engine.sync_client().get(key)
    assert (out.state, out.size_bytes) == ("stored_new", len(value))
    assert getattr(got, "value", None) == value


@MODES
async def test_kv_exists_checks_many_keys_at_once(engine: RunningEngine, mode: str) -> None:
    present = [fresh_key() for _ in range(3)]
    absent = [fresh_key("absent") for _ in range(2)]
    for key in present:
        engine.sync_client().put(key, b"x")
    async with Client(build_server(engine.settings), mode=mode) as client:
        out = KvExistsOut.model_validate(
            await call_ok(client, "kv_exists", {"keys": present + absent})
        )
    assert [r.present for r in out.results] == [True, True, True, False, False]
    assert [r.key for r in out.results] == present + absent
    assert (out.present_count, out.missing_count, out.reachable) == (3, 2, True)


@MODES
async def test_kv_stats_names_the_backend_and_reports_deltas_since_a_snapshot(
    engine: RunningEngine, mode: str
) -> None:
    async with Client(build_server(engine.settings), mode=mode) as client:
        before = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
        assert before.engine is not None
        await call_ok(client, "kv_put", {"key": fresh_key(), "value_b64": b64(b"delta")})
        after = KvStatsOut.model_validate(
            await call_ok(client, "kv_stats", {"since": before.snapshot_id})
        )
    assert (before.reachable, before.backend, before.base_url) == (
        True,
        engine.backend,
        engine.base_url,
    )
    assert after.delta is not None
    moved = after.delta.put_new if engine.backend == "durable" else after.delta.unique_blocks
    assert moved == 1
    assert after.client is not None and after.client.puts_stored_new == 1


@MODES
async def test_kv_stats_refuses_an_unknown_snapshot_id_naming_the_fix(
    engine: RunningEngine, mode: str
) -> None:
    async with Client(build_server(engine.settings), mode=mode) as client:
        first = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
        message = await call_error(client, "kv_stats", {"since": "kv-00000000"})
    assert first.snapshot_id is not None and first.snapshot_id.startswith("kv-")
    assert "since='kv-00000000' is not a snapshot this server holds" in message
    assert "pass the snapshot_id it returns" in message


@MODES
async def test_kv_probe_passes_every_check_on_a_healthy_engine(
    engine: RunningEngine, mode: str
) -> None:
    async with Client(build_server(engine.settings), mode=mode) as client:
        out = KvProbeOut.model_validate(await call_ok(client, "kv_probe", {"samples": 5}))
    assert out.passed and out.reachable
    assert [check.name for check in out.checks] == [
        "reachable",
        "auth",
        "round_trip",
        "dedup",
        "latency",
    ]
    assert out.samples == 5 and out.latency_p50_ms is not None


@MODES
async def test_kv_tools_report_unreachable_with_a_reason_when_nothing_listens(
    mode: str, tmp_path: Path
) -> None:
    port = free_port()
    settings = Settings.build(kv_url=f"http://127.0.0.1:{port}", data_dir=tmp_path)
    key = fresh_key()
    async with Client(build_server(settings), mode=mode) as client:
        stats = KvStatsOut.model_validate(await call_ok(client, "kv_stats", {}))
        got = KvGetManyOut.model_validate(await call_ok(client, "kv_get", {"keys": [key]}))
        put = KvPutOut.model_validate(
            await call_ok(client, "kv_put", {"key": key, "value_b64": b64(b"x")})
        )
        exists = KvExistsOut.model_validate(await call_ok(client, "kv_exists", {"keys": [key]}))
        probe = KvProbeOut.model_validate(await call_ok(client, "kv_probe", {}))
    for out in (stats, got, put, exists, probe):
        assert out.reachable is False
        assert out.reason is not None and str(port) in out.reason
    assert got.results[0].hit is False and exists.results[0].present is None
    assert not probe.passed and probe.checks[0].name == "reachable"
    assert not (tmp_path / "engine" / "state.json").exists()  # configured URL: nothing started
