"""A real `lmcache coordinator` (from .venv-lmcache) on a free loopback port, for tests."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import coordinator_spec, coordinator_url
from tests.support.lmcache import require_lmcache

READY_S = 120.0


@contextmanager
def running_coordinator(
    log_dir: Path, *, chunk_size: int = 256, port: int | None = None
) -> Iterator[str]:
    """The planned coordinator (`coordinator_spec`, state under `log_dir`), its URL while it
    runs; stopped (TERM, then KILL) on exit."""
    port = port or free_port()
    url = coordinator_url(port)
    spec = coordinator_spec(port=port, state_dir=log_dir, chunk_size=chunk_size)
    command = [str(require_lmcache()), *spec.argv[1:]]
    env = {**os.environ, **spec.env}
    with (log_dir / "coordinator.log").open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + READY_S
        while True:
            try:
                with urllib.request.urlopen(url + "/instances", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lmcache coordinator did not start; see {log_dir}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
