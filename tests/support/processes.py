"""Launching the installed console scripts for end-to-end tests, in a hermetic environment."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.state import EngineState
from graph_kvcache_mcp.connectors.processes.identity import is_ours

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


@contextmanager
def engine_session(data_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A stdio server session run with `--start-engine` (its stdin held open, so it stays up),
    yielded once its engine runs; killed if still alive, and its stdin closed, on exit."""
    session = subprocess.Popen(
        [str(venv_script("graph-kvcache-mcp")), "--start-engine", "--data-dir", str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=clean_env(),
    )
    try:
        wait_until(
            lambda: running_engine_state(data_dir) is not None,
            timeout_s=30,
            what="--start-engine to start the engine",
        )
        yield session
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        if session.stdin is not None:
            session.stdin.close()


# Known values for secrets a child process must never receive (tests set them, then look).
SECRETS = {
    "VLLM_API_KEY": "vllm-key-for-test-7c1e",
    "GRAPH_KVCACHE_HTTP_TOKEN": "http-token-for-test-91ab",
    "GRAPH_KVCACHE_BUNDLE_SECRET": "bundle-secret-for-test-4d2f",
    "EPISTEMIC_GRAPH_KVCACHE_TOKEN": "kv-token-for-test-0e55",
}


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return {name: value for name, _, value in pairs}


def modes_under(root: Path) -> dict[str, int]:
    """Permission bits of `root` and everything under it (links are not followed)."""
    paths = [root, *root.rglob("*")]
    return {str(path.relative_to(root)): stat.S_IMODE(path.lstat().st_mode) for path in paths}


def wider_than_private(modes: dict[str, int], root: Path) -> dict[str, str]:
    return {
        name: oct(mode)
        for name, mode in modes.items()
        if mode & 0o077 and not (root / name).is_socket()  # a socket's mode is not its access
    }
