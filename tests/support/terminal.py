"""Run the console script with a pseudo-terminal as its stdin, as a person at a shell would, and
read what it says on stderr before anyone types."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CTRL_D = b"\x04"
"""End of input on a terminal in canonical mode."""


class OnATerminal:
    """A process whose stdin is a terminal we hold the other end of."""

    def __init__(self, process: subprocess.Popen[bytes], leader: int) -> None:
        self.process = process
        self.leader = leader

    def stderr_until(self, marker: bytes, *, timeout_s: float = 60.0) -> bytes:
        """What it wrote on stderr up to `marker` (or all of it by `timeout_s`)."""
        assert self.process.stderr is not None
        said = b""
        deadline = time.monotonic() + timeout_s
        while marker not in said and time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stderr], [], [], 1.0)
            if ready:
                chunk = os.read(self.process.stderr.fileno(), 4096)
                if not chunk:
                    break
                said += chunk
        return said

    def type(self, keys: bytes) -> None:
        os.write(self.leader, keys)


@contextmanager
def on_a_terminal(command: list[str], *, cwd: Path, env: dict[str, str]) -> Iterator[OnATerminal]:
    """Start `command` with a terminal as stdin (stdout discarded, stderr piped); killed on exit
    if it still runs."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdin=follower, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(follower)
    try:
        yield OnATerminal(process, leader)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
