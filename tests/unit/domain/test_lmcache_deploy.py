"""The files under connectors/ are exactly what the generator renders (no hand edits, no drift)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from graph_kvcache_mcp.domain.lmcache.deploy import render_deploy_files

REPO = Path(__file__).resolve().parents[3]


def test_connectors_files_match_the_generator() -> None:
    stale = [
        path
        for path, text in render_deploy_files().items()
        if not (REPO / path).is_file() or (REPO / path).read_text(encoding="utf-8") != text
    ]
    assert stale == [], f"regenerate with: python tools/gen_lmcache_deploy.py ({stale})"


def test_every_file_in_connectors_comes_from_the_generator() -> None:
    on_disk = {
        str(path.relative_to(REPO)) for path in (REPO / "connectors").iterdir() if path.is_file()
    }
    assert on_disk == set(render_deploy_files())


def test_the_regeneration_script_reports_drift_and_fixes_it(tmp_path: Path) -> None:
    script = REPO / "tools" / "gen_lmcache_deploy.py"
    check = [sys.executable, str(script), "--check", "--root", str(tmp_path)]
    assert subprocess.run(check, capture_output=True, check=False).returncode == 1
    write = [sys.executable, str(script), "--root", str(tmp_path)]
    assert subprocess.run(write, capture_output=True, check=False).returncode == 0
    assert subprocess.run(check, capture_output=True, check=False).returncode == 0


def test_deploy_files_hold_no_secret_values() -> None:
    """Every token, secret or signer key is a reference to the operator's environment."""
    assignments = 0
    for path, text in render_deploy_files().items():
        for name, value in re.findall(r"(\w*(?:TOKEN|SECRET|SIGNER_KEYS)\w*)\s*[:=]\s*(\S+)", text):
            assignments += 1
            literal = not (value.startswith("$") or "$(" in value)
            assert not literal, f"{path}: {name} is given a literal value"
    assert assignments >= 4
