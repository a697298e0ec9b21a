"""CI's benchmark smoke runs: one `tools/bench_*.py`, small, whose lines are printed into CI's
log, never asserted as timings (on a shared machine a timing is no pass/fail)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.vllm import REPO

BENCH_TIMEOUT_S = 300


def run_bench(python: Path | str, script: str, *args: str) -> list[str]:
    """Run `tools/<script>` with `args` under `python` from the repository root; its stdout
    lines (it must exit 0)."""
    done = subprocess.run(
        [str(python), str(REPO / "tools" / script), *args],
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT_S,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()
