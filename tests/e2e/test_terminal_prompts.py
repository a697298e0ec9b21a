"""`kv put KEY` with no value on a terminal says it reads stdin instead of waiting silently
(#39 item 5); run as the real console script on a pseudo-terminal."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import clean_env, venv_script
from tests.support.terminal import CTRL_D, on_a_terminal


def test_kv_put_on_a_terminal_says_it_reads_the_value_from_stdin(tmp_path: Path) -> None:
    command = [str(venv_script("graph-kvcache-mcp")), "kv", "put", "k", "--url"]
    env = clean_env(GRAPH_KVCACHE_DATA_DIR=str(tmp_path / "data"))
    with on_a_terminal([*command, "http://127.0.0.1:9"], cwd=tmp_path, env=env) as terminal:
        said = terminal.stderr_until(b"Ctrl-D")
        assert b"reading the value from stdin" in said and b"Ctrl-D" in said
        terminal.type(CTRL_D)  # at once: an empty value, refused
        assert terminal.process.wait(timeout=60) == 2
        assert terminal.process.stderr is not None
        assert b"--allow-empty" in terminal.process.stderr.read()
