"""`tools/gpu_check.py` on a machine without a CUDA GPU: it says so, measures nothing, exits 0
(the GPU proofs themselves need a lent GPU; docs/vllm-connector.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.vllm.platform import detect_platform

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(detect_platform().kind == "gpu", reason="a CUDA GPU is visible here")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no nvidia-smi on it
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu_check.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "no CUDA GPU on this machine" in done.stdout and "nothing measured" in done.stdout
