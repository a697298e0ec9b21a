"""Process identity reads Linux's /proc; anywhere else it refuses loudly instead of guessing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.processes.identity import is_alive, require_linux, start_ticks
from graph_kvcache_mcp.errors import ProcessError


def test_on_linux_this_process_is_alive_under_its_own_start_time() -> None:
    require_linux()
    ticks = start_ticks(os.getpid())
    assert ticks is not None and is_alive(os.getpid(), ticks)
    assert not is_alive(os.getpid(), ticks + 1)


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_elsewhere_identity_checks_and_engine_stop_refuse_with_a_clear_error(
    platform: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "platform", platform)
    with pytest.raises(ProcessError, match=f"need Linux.*this is {platform}") as refused:
        start_ticks(os.getpid())
    assert "EPISTEMIC_GRAPH_KVCACHE_URL" in str(refused.value)
    engine = ManagedEngine(tmp_path)
    engine.state_file.path.parent.mkdir(parents=True)
    engine.state_file.path.write_text(
        '{"process": {"pid": 1, "start_ticks": 1, "command": ["x"], "started_at": 0,'
        ' "log_path": "x"}, "port": 1, "backend": "memory", "base_url": "http://127.0.0.1:1",'
        ' "data_dir": "x"}'
    )
    with pytest.raises(ProcessError, match="need Linux"):
        engine.stop()  # never a silent "not running"
