"""The tiny random Mamba2 hybrids (`tests/support/tiny_hybrid.py`), built once per recipe.

`hybrid_model_dir("granite")` (two KV cache groups) or `("nemotron")` (three) builds the model
with the vLLM venv's interpreter into `.test-artifacts/`, keyed by the builder's source digest
like `tiny_model_dir`, so a changed recipe rebuilds.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from tests.support.vllm import ARTIFACTS, REPO, require_vllm_venv

HYBRID_BUILDER = REPO / "tests" / "support" / "tiny_hybrid.py"
BUILD_TIMEOUT_S = 600.0
HYBRID_BLOCK = {"granite": 32, "nemotron": 32}
"""The attention block vLLM 0.32 uses on CPU for each tiny hybrid with --block-size 32: it keeps
32 (no "Setting attention block size" line in its log)."""


def hybrid_model_dir(family: str) -> Path:
    """The tiny `family` hybrid's dir ("granite" or "nemotron"), built on first use."""
    digest = hashlib.sha256(HYBRID_BUILDER.read_bytes()).hexdigest()[:12]
    out = ARTIFACTS / f"tiny-{family}-hybrid-{digest}"
    if not (out / "config.json").exists():
        python = require_vllm_venv()
        command = [str(python), str(HYBRID_BUILDER), str(out), "--family", family]
        subprocess.run(command, check=True, timeout=BUILD_TIMEOUT_S, cwd=REPO)
    return out


def hybrid_recipe(block: int) -> tuple[str, ...]:
    """vLLM flags that cache a Mamba2 hybrid's prefixes on CPU, for attention block `block`
    (prefix caching itself is the launch plan's own flag; vLLM derives align mode from it)."""
    return (
        "--max-num-batched-tokens",
        str(block),
        "--hf-overrides",
        json.dumps({"mamba_chunk_size": block}),
    )
