"""`measure_restart_reuse` refuses clearly when there is nothing it could measure, and names a
configured vLLM or lmcache server as not managed here instead of restarting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.processes.identity import ProcessRecord
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.lmcache.config import MP_CONNECTOR_CLASS
from graph_kvcache_mcp.domain.targets import Configured
from graph_kvcache_mcp.domain.vllm.wiring import KvWiring
from graph_kvcache_mcp.errors import VllmProcessError
from graph_kvcache_mcp.services.stack.description import StackDescription
from graph_kvcache_mcp.services.stack.stack import Stack
from graph_kvcache_mcp.services.vllm.restart_reuse import _lmcache_of, measure_restart_reuse
from tests.support.vllm_records import vllm_record

LOOPBACK = "http://127.0.0.1:8000/v1"
REMOTE = "https://vllm.elsewhere.example:8443/v1"
REMOTE_LMCACHE = "https://lmcache.elsewhere.example:8080"


async def test_without_a_managed_vllm_it_says_how_to_start_one(tmp_path: Path) -> None:
    settings = Settings.build(kv_url="http://127.0.0.1:9", data_dir=tmp_path)
    with pytest.raises(VllmProcessError, match="kv_connector='engine'"):
        await measure_restart_reuse(Stack.of(settings), LOOPBACK, prompt_tokens=128)


async def test_a_configured_vllm_is_refused_as_not_managed_here(tmp_path: Path) -> None:
    settings = Settings.build(kv_url="http://127.0.0.1:9", data_dir=tmp_path)
    with pytest.raises(VllmProcessError) as refused:
        await measure_restart_reuse(Stack.of(settings), REMOTE, prompt_tokens=128)
    message = str(refused.value)
    assert message.startswith(f"not managed here: {REMOTE}")
    assert "restarts the vLLM it measures" in message and "127.0.0.1" not in message


def test_restarting_a_configured_lmcache_server_is_refused_and_named() -> None:
    # A managed MP vLLM as its state record says: only its wiring is read.
    process = ProcessRecord(pid=1, start_ticks=1, command=("vllm",), started_at=0.0, log_path="x")
    wiring = KvWiring(connector=MP_CONNECTOR_CLASS, lmcache_port=5555)
    vllm = vllm_record(process, port=8000, base_url=LOOPBACK, wiring=wiring)
    stack = StackDescription(data_dir="/d", vllm=vllm)
    server = Configured("lmcache server", REMOTE_LMCACHE)
    with pytest.raises(VllmProcessError, match=f"but not managed here: {REMOTE_LMCACHE}"):
        _lmcache_of(stack, "stack", server)
    assert _lmcache_of(stack, "vllm", server) == REMOTE_LMCACHE  # measured, split by its counters


def test_restart_without_a_managed_vllm_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VllmProcessError, match="vllm_start"):
        ManagedVllm(tmp_path).restart()
