"""Tiny random Mamba2 hybrids for tests, built once into `.test-artifacts/` (keyed by the
builder's source digest, so a changed recipe rebuilds), with the vLLM venv's interpreter."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from tests.support.vllm import ARTIFACTS, REPO, require_vllm_venv

HYBRID_BUILDER = REPO / "tests" / "support" / "tiny_hybrid.py"


def hybrid_model_dir(family: str) -> Path:
    """The tiny `family` hybrid's dir (granite: two KV cache groups; nemotron: three)."""
    digest = hashlib.sha256(HYBRID_BUILDER.read_bytes()).hexdigest()[:12]
    out = ARTIFACTS / f"tiny-{family}-{digest}"
    if not (out / "config.json").exists():
        subprocess.run(
            [str(require_vllm_venv()), str(HYBRID_BUILDER), str(out), "--family", family],
            check=True,
            cwd=REPO,
            capture_output=True,
        )
    return out
