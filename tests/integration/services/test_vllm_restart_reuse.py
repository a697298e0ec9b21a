"""`measure_restart_reuse` refuses clearly when there is nothing it could measure."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.errors import VllmProcessError
from graph_kvcache_mcp.services.stack.stack import Stack
from graph_kvcache_mcp.services.vllm.restart_reuse import measure_restart_reuse


async def test_without_a_managed_vllm_it_says_how_to_start_one(tmp_path: Path) -> None:
    settings = Settings.build(kv_url="http://127.0.0.1:9", data_dir=tmp_path)
    with pytest.raises(VllmProcessError, match="kv_connector='engine'"):
        await measure_restart_reuse(Stack.of(settings), prompt_tokens=128)


def test_restart_without_a_managed_vllm_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VllmProcessError, match="vllm_start"):
        ManagedVllm(tmp_path).restart()
