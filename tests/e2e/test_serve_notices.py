"""What `serve` says on stderr before it serves, run as the real console script (#39 items 3, 8):
a working directory too broad to be the file root, a --port that stdio would ignore, and a bare
start on a terminal that would otherwise look hung."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.processes import clean_env, venv_script
from tests.support.terminal import CTRL_D, on_a_terminal

SERVE = [str(venv_script("graph-kvcache-mcp")), "serve"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(GRAPH_KVCACHE_DATA_DIR=str(tmp_path / "data"), **extra)


def test_serve_from_slash_without_roots_warns_how_to_set_them(tmp_path: Path) -> None:
    done = subprocess.run(
        SERVE, cwd="/", env=_env(tmp_path), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "GRAPH_KVCACHE_FILE_ROOTS=" in done.stderr and "no file roots" in done.stderr
    configured = subprocess.run(
        SERVE, cwd="/", env=_env(tmp_path, GRAPH_KVCACHE_FILE_ROOTS=str(tmp_path)),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "no file roots" not in configured.stderr


def test_serve_with_a_port_but_no_http_transport_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [*SERVE, "--port", "9999"], cwd=tmp_path, env=_env(tmp_path),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--transport http" in done.stderr and "--port 9999" in done.stderr


def test_a_bare_serve_on_a_terminal_says_it_speaks_mcp_on_stdin(tmp_path: Path) -> None:
    with on_a_terminal(SERVE, cwd=tmp_path, env=_env(tmp_path)) as terminal:
        said = terminal.stderr_until(b"stdin")
        assert b"speaks MCP" in said and b"stdin" in said
        terminal.type(CTRL_D)
        assert terminal.process.wait(timeout=60) == 0
