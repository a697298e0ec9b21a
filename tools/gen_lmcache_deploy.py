"""Write the deploy files under `connectors/` from the LMCache config generator.

Usage: `.venv/bin/python tools/gen_lmcache_deploy.py` (writes), `... --check` (exit 1 and name
the files that differ, without writing). `tests/unit/domain/test_lmcache_deploy.py` runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graph_kvcache_mcp.domain.lmcache.deploy import render_deploy_files

REPO = Path(__file__).resolve().parents[1]


def stale_files(root: Path) -> list[str]:
    """Paths (relative to `root`) whose content differs from the generator's output."""
    return [
        path
        for path, text in render_deploy_files().items()
        if not (root / path).is_file() or (root / path).read_text(encoding="utf-8") != text
    ]


def write_files(root: Path) -> list[str]:
    written = []
    for path, text in render_deploy_files().items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that differ")
    parser.add_argument("--root", type=Path, default=REPO, help="repository root")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.root)
        for path in stale:
            print(f"out of date: {path}", file=sys.stderr)
        return 1 if stale else 0
    for path in write_files(args.root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
