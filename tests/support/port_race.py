"""Race a squatter for the engine's port inside a private network namespace.

Run as `unshare -n -- python -m tests.support.port_race MODE DATA_DIR`: brings up loopback in
the new namespace (so fixed ports cannot collide with anything else on the machine), starts the
squatter (`tests/support/squatter.py`) as `nobody`, starts the managed engine on a fixed port and
prints one JSON line per attempt: whether the squatter won the race, what our start said, the
token before and after, and everything the squatter received.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.errors import EngineProcessError

SQUATTER = Path(__file__).with_name("squatter.py")
ATTEMPTS = 6


def attempt(mode: str, data_dir: Path, port: int) -> dict[str, object]:
    managed = ManagedEngine(data_dir)
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
            mode,
            marker,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert squatter.stdout is not None
    assert squatter.stdout.readline().strip() == "ready"
    error = None
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
