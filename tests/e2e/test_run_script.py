"""`./run.sh demo` installs once per pyproject.toml, then runs the demo without pip (so offline
too) while the install is current (#39 item 8).

The venv is a test double (`fake_venv`): a `python` that runs the real interpreter for `-c` and
records every other call (pip) instead of installing, and a console script that records the demo
it was asked to run; what is under test is run.sh's own logic.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO, clean_env


def fake_venv(root: Path, calls: Path) -> None:
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\n'
        f'echo "python $*" >> {calls}\n'
    )
    script = bin_dir / "graph-kvcache-mcp"
    script.write_text(f'#!/usr/bin/env bash\necho "graph-kvcache-mcp $*" >> {calls}\n')
    for made in (python, script):
        made.chmod(0o755)


def run_demo(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "run.sh"), "demo"], cwd=root, env=clean_env(PYTHON="/bin/false"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_demo_skips_a_current_install_and_reinstalls_after_pyproject_changes(
    tmp_path: Path,
) -> None:
    calls = tmp_path / "calls.log"
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("run.sh", "pyproject.toml", "graph_kvcache_mcp/domain/versions.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)  # run.sh reads the pins from versions.py
    fake_venv(root, calls)

    first = run_demo(root)
    assert first.returncode == 0, first.stderr
    assert "pip install -q -e .[dev,engine,bench]" in calls.read_text()
    calls.write_text("")

    second = run_demo(root)
    assert second.returncode == 0, second.stderr
    assert calls.read_text() == "graph-kvcache-mcp demo\n"  # no pip: works offline
    assert "current" in second.stderr

    with (root / "pyproject.toml").open("a") as pyproject:
        pyproject.write("\n# changed\n")
    calls.write_text("")
    third = run_demo(root)
    assert third.returncode == 0, third.stderr
    assert "pip install" in calls.read_text()
