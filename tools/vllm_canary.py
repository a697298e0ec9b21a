"""Check vLLM builds for every private name, field, event tag and metric the project relies on.

    .venv/bin/python tools/vllm_canary.py WHEEL_OR_SITE_PACKAGES [...]

Each argument is a vLLM wheel (`pip download --no-deps vllm==X`) or a directory holding the
`vllm` package (e.g. `.venv-vllm/lib/python3.11/site-packages`). The sources are read, never
imported, so a CUDA wheel is checked on a CPU host. Prints one line per seam that moved and a
summary per build; exits 1 when any moved (raise the supported version only after fixing them).
"""

from __future__ import annotations

import sys
from pathlib import Path

from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.services.vllm.canary import check_build


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    moved = 0
    for arg in argv:
        try:
            results = check_build(Path(arg))
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        missing = [r for r in results if not r.found]
        for result in missing:
            print(f"MOVED  {result.check.label}: {result.detail} ({result.check.use})")
        print(f"{arg}: {len(results) - len(missing)} of {len(results)} seams in place")
        moved += len(missing)
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
