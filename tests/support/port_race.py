"""Race a squatter for the engine's port inside a private network namespace.

Run as `unshare -n -- python -m tests.support.port_race MODE DATA_DIR` (MODE: `listen`, `bind`,
or `heal`: a session's engine is SIGKILLed, the squatter races its restart): brings up loopback in
the new namespace (so fixed ports cannot collide with anything else on the machine), starts the
squatter (`tests/support/squatter.py`) as `nobody`, starts the managed engine on a fixed port and
prints one JSON line per attempt: whether the squatter won the race, what our start said, the
token before and after, and everything the squatter received.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.managed_access import ManagedKvAccess
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.processes.identity import is_ours
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError

SQUATTER = Path(__file__).with_name("squatter.py")
ATTEMPTS = 6


def attempt(mode: str, data_dir: Path, port: int) -> dict[str, object]:
    managed = ManagedEngine(data_dir)
    access: ManagedKvAccess | None = None
    if mode == "heal":  # a session's engine dies; the squatter races its restart
        access = ManagedKvAccess(Settings.build(data_dir=data_dir, engine_port=port))
        anyio.run(access.start_engine)
        state = managed.running_state()
        assert state is not None
        os.kill(state.process.pid, signal.SIGKILL)
        while is_ours(state.process):
            time.sleep(0.02)
    token_before = managed.token().get_secret_value()
    marker = str(managed.home / "engine.sock")
    squatter = subprocess.Popen(
        [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "/usr/bin/python3",
            str(SQUATTER),
            str(port),
            "bind" if mode == "bind" else "listen",
            marker,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert squatter.stdout is not None
    assert squatter.stdout.readline().strip() == "ready"
    error = None
    if access is not None:
        healed = anyio.run(lambda: access.connect(wait_s=60.0))
        error = healed.reason if isinstance(healed, Unavailable) else None
        anyio.run(access.aclose)
    else:
        try:
            managed.start(port=port, backend="memory", ready_timeout_s=60.0)
        except EngineProcessError as exc:
            error = str(exc)
    engine_left = managed.running_state() is not None
    managed.stop(term_wait_s=5.0)
    squatter.kill()
    lines = squatter.communicate(timeout=10)[0].splitlines()
    received = b"".join(bytes.fromhex(line.split()[1]) for line in lines if line.startswith("got "))
    return {
        "won": "won" in lines,
        "error": error,
        "engine_left": engine_left,
        "token_sent": token_before.encode() in received,
        "requests": sum(line.startswith("got ") for line in lines),
        "rotated": managed.token().get_secret_value() != token_before,
    }


def main() -> None:
    mode, data_dir = sys.argv[1], Path(sys.argv[2])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for number in range(ATTEMPTS):
        result = attempt(mode, data_dir / f"attempt-{number}", 20000 + number)
        print(json.dumps(result), flush=True)
        if result["won"]:
            break


if __name__ == "__main__":
    main()
