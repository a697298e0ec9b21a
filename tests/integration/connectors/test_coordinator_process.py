"""The managed coordinator, real (.venv-lmcache): started once and reused, refused when the
servers hash differently, and its checkpoint kept in the data dir across a stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.connectors.processes.identity import is_ours
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import CHECKPOINT_FILE
from graph_kvcache_mcp.errors import LmcacheProcessError
from tests.support.lmcache import require_lmcache

pytestmark = [pytest.mark.lmcache]


def test_the_coordinator_is_started_once_reused_and_stopped_with_its_checkpoint(
    tmp_path: Path,
) -> None:
    managed = ManagedCoordinator(tmp_path, python=require_lmcache().parent / "python")
    try:
        first = managed.ensure(chunk_size=256, hash_algorithm="blake3")
        again = managed.ensure(chunk_size=256, hash_algorithm="blake3")
        assert again.process.pid == first.process.pid and first.url.startswith("http://127.0.0.1:")
        with pytest.raises(LmcacheProcessError, match="hashes 256-token chunks with blake3"):
            managed.ensure(chunk_size=128, hash_algorithm="blake3")
    finally:
        stopped = managed.stop()
    assert stopped and not is_ours(first.process)
    assert (managed.home / CHECKPOINT_FILE).exists()
    assert managed.running_state() is None and managed.stop() is False
