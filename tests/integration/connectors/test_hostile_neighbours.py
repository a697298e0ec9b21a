"""Attacks of a second local user (`nobody`) on the managed engine, staged for real.

Ports are squatted inside a network namespace each test creates (`unshare -n`), so fixed ports
never meet anything else on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.engines import require_in_ci

ROOT = Path(__file__).resolve().parents[3]


def _require_namespaces() -> None:
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("unshare", "setpriv", "ip")):
        require_in_ci("root with unshare, setpriv and ip (network namespaces, a second user)")


def _race(mode: str, tmp_path: Path) -> list[dict[str, object]]:
    _require_namespaces()
    tmp_path.chmod(0o755)  # the squatter, as nobody, only reads /proc: nothing of ours
    done = subprocess.run(
        [
            "unshare",
            "-n",
            "--",
            sys.executable,
            "-m",
            "tests.support.port_race",
            mode,
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    attempts = [json.loads(line) for line in done.stdout.splitlines()]
    assert attempts and attempts[-1]["won"], f"the squatter never won the race: {attempts}"
    return attempts


def test_a_squatter_that_takes_the_port_gets_no_token_and_the_start_fails(tmp_path: Path) -> None:
    won = _race("listen", tmp_path)[-1]
    assert won["requests"] == 0 and not won["token_sent"]
    assert won["error"] is not None and "taken by another process" in str(won["error"])
    assert won["rotated"] and not won["engine_left"]


def test_a_failed_bind_in_the_engine_log_is_a_failed_start(tmp_path: Path) -> None:
    won = _race("bind", tmp_path)[-1]
    assert won["error"] is not None and "could not bind port" in str(won["error"])
    assert won["rotated"] and not won["engine_left"]
