"""Tiny random Mamba2 hybrids for tests (`tiny_hybrid.py`), built once into `.test-artifacts/`.

Keyed by the builder's source digest, like `vllm.tiny_model_dir`. The flags CPU vLLM needs to
cache a hybrid's prefixes without crashing (hybrid-cpu facts): prefix caching, align mode, and a
step and mamba chunk of exactly the attention block vLLM picks (`HYBRID_BLOCK`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from tests.support.vllm import ARTIFACTS, require_vllm_venv

BUILDER = Path(__file__).with_name("tiny_hybrid.py")
HYBRID_BLOCK = {"granite": 32, "nemotron": 32}
"""The attention block vLLM 0.32 picks on CPU for each tiny hybrid with --block-size 32 (its log:
"Setting attention block size to N tokens")."""


def hybrid_model_dir(family: str) -> Path:
    """The tiny `family` hybrid's dir ("granite": two KV cache groups, "nemotron": three)."""
    digest = hashlib.sha256(BUILDER.read_bytes()).hexdigest()[:12]
    out = ARTIFACTS / f"tiny-{family}-{digest}"
    if not (out / "config.json").exists():
        command = [str(require_vllm_venv()), str(BUILDER), str(out), "--family", family]
        subprocess.run(command, check=True, timeout=300)
    return out


def hybrid_recipe(block: int) -> tuple[str, ...]:
    """vLLM flags that cache a Mamba2 hybrid's prefixes on CPU, for attention block `block`
    (prefix caching itself is the launch plan's own flag)."""
    return (
        "--mamba-cache-mode",
        "align",
        "--max-num-batched-tokens",
        str(block),
        "--hf-overrides",
        json.dumps({"mamba_chunk_size": block}),
    )
