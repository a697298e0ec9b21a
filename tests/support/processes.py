"""Launching the installed console scripts for end-to-end tests, in a hermetic environment."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from graph_kvcache_mcp.connectors.engine_process import EngineState, ManagedEngine
from graph_kvcache_mcp.connectors.process_tools import is_ours

REPO = Path(__file__).resolve().parents[2]


def venv_script(name: str) -> Path:
    """A console script installed next to this interpreter (`graph-kvcache-mcp`, `mcp`)."""
    return Path(sys.executable).with_name(name)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any engine or server setting, plus `extra`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("EPISTEMIC_GRAPH_", "GRAPH_KVCACHE_", "XDG_DATA_HOME"))
    }
    env.update(extra)
    return env


def wait_until(condition: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    """Poll `condition` until it holds; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)


def running_engine_state(data_dir: Path) -> EngineState | None:
    return ManagedEngine(data_dir).running_state()


def engine_gone(state: EngineState) -> bool:
    return not is_ours(state.process)
