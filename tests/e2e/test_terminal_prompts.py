"""`kv put KEY` with no value on a terminal says it reads stdin instead of waiting silently
(#39 item 5); run as the real console script on a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

from tests.support.processes import clean_env, venv_script


def test_kv_put_on_a_terminal_says_it_reads_the_value_from_stdin(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    command = [str(venv_script("graph-kvcache-mcp")), "kv", "put", "k", "--url"]
    process = subprocess.Popen(
        [*command, "http://127.0.0.1:9"], cwd=tmp_path, stdin=follower,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=clean_env(GRAPH_KVCACHE_DATA_DIR=str(tmp_path / "data")),
    )  # fmt: skip
    os.close(follower)
    try:
        assert process.stderr is not None
        said = b""
        deadline = time.monotonic() + 60
        while b"Ctrl-D" not in said and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stderr], [], [], 1.0)
            if ready:
                said += os.read(process.stderr.fileno(), 4096)
        assert b"reading the value from stdin" in said and b"Ctrl-D" in said
        os.write(leader, b"\x04")  # Ctrl-D at once: an empty value, refused
        assert process.wait(timeout=60) == 2
        assert b"--allow-empty" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
