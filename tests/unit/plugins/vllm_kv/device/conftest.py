"""The device copy path's tests import torch and vLLM, which the test venv lacks: they run in
the vLLM venv, started from the main suite by `tests/unit/plugins/vllm_kv/test_device_suite.py`,
and are collected only where torch and vLLM import."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from graph_kvcache_mcp.connectors.engine.client import SyncKvClient
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore

collect_ignore_glob = (
    [] if importlib.util.find_spec("torch") and importlib.util.find_spec("vllm") else ["test_*.py"]
)


@pytest.fixture
def unreachable_store() -> Iterator[EngineBlockStore]:
    """A store whose engine does not answer: loads miss, nothing is written."""
    client = SyncKvClient("http://127.0.0.1:9", None, timeout_s=2.0)
    store = EngineBlockStore(client, timeout_s=2.0, concurrency=2)
    yield store
    store.close(flush_timeout_s=0.0)
