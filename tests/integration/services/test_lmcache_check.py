"""The LMCache adapter check against real engines: every step passes with sensible figures, and
a wrong token or a stopped engine is reported, not raised."""

from __future__ import annotations

from pydantic import SecretStr

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.services.lmcache.check import run_lmcache_check
from tests.support.engines import RunningEngine


def test_every_step_passes_on_the_memory_backend_with_byte_figures(
    memory_engine: RunningEngine,
) -> None:
    out = run_lmcache_check(memory_engine.base_url, memory_engine.token, page_bytes=4096)
    assert out.passed, out
    assert [step.name for step in out.steps] == ["client", "set", "stored", "get", "dedup"]
    steps = {step.name: step for step in out.steps}
    assert steps["stored"].figures["unique_blocks"] >= 1
    assert steps["stored"].figures["logical_bytes"] >= 4096
    assert steps["get"].figures["sha256_sent"] == steps["get"].figures["sha256_read"]
    assert steps["dedup"].figures["dedup_hits"] >= 1
    assert steps["dedup"].figures["resident_bytes"] == 0
    assert out.backend == "memory" and out.engine_key and out.engine_key.startswith("lmc1:")


def test_the_durable_backend_is_judged_by_put_new(durable_engine: RunningEngine) -> None:
    out = run_lmcache_check(durable_engine.base_url, durable_engine.token, page_bytes=1000)
    assert out.passed, out
    steps = {step.name: step for step in out.steps}
    assert steps["stored"].figures == {"put_new": 1}
    assert "resident_bytes" not in steps["dedup"].figures


def test_a_wrong_token_stops_the_check_with_the_reason(memory_engine: RunningEngine) -> None:
    out = run_lmcache_check(memory_engine.base_url, SecretStr("not-the-token"))
    assert (out.reachable, out.passed) == (True, False)
    assert out.reason and "401" in out.reason
    assert "not-the-token" not in out.model_dump_json()


def test_a_stopped_engine_reads_as_unreachable() -> None:
    out = run_lmcache_check(f"http://127.0.0.1:{free_port()}", SecretStr("t"))
    assert (out.reachable, out.passed) == (False, False)
    assert out.reason and "not reachable" in out.reason
