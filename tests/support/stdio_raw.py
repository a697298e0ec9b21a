"""A stdio server driven with raw bytes, for what a JSON encoder cannot send (broken JSON, lone
surrogate escapes, batches): one line in, the server's answer lines out within a deadline."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.processes import clean_env, venv_script

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw-bytes", "version": "1"},
    },
}


class RawStdio:
    """One `graph-kvcache-mcp` stdio process; its stderr goes to `log_path`."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path
        self._buffer = b""

    def send(self, line: bytes | dict[str, Any]) -> None:
        data = json.dumps(line).encode() if isinstance(line, dict) else line
        assert self.process.stdin is not None
        self.process.stdin.write(data + b"\n")
        self.process.stdin.flush()

    def answers(self, count: int, *, within_s: float) -> list[dict[str, Any]]:
        """The next `count` lines the server writes; fails if they do not come in `within_s`."""
        assert self.process.stdout is not None
        out = self.process.stdout.fileno()
        deadline = time.monotonic() + within_s
        while self._buffer.count(b"\n") < count:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([out], [], [], max(left, 0))
            if not ready:
                raise AssertionError(f"no answer within {within_s:g} s (got {self._buffer!r})")
            chunk = os.read(out, 65536)
            if not chunk:
                raise AssertionError(f"the server closed stdout (got {self._buffer!r})")
            self._buffer += chunk
        lines = self._buffer.split(b"\n")
        self._buffer = b"\n".join(lines[count:])
        return [json.loads(line) for line in lines[:count]]

    def ask(self, line: bytes | dict[str, Any], *, within_s: float) -> dict[str, Any]:
        self.send(line)
        (answer,) = self.answers(1, within_s=within_s)
        return answer

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def raw_stdio(data_dir: Path, *args: str) -> Iterator[RawStdio]:
    """A stdio server (`args` added) on `data_dir`; killed on exit if it is still running."""
    log_path = data_dir / "server-stderr.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(venv_script("graph-kvcache-mcp")), "--data-dir", str(data_dir), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=clean_env(),
        )
    try:
        yield RawStdio(process, log_path)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
