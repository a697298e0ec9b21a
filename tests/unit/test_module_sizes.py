"""Every module of the package stays within 400 lines: past that it holds more than one job
and splits along a seam (docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

import graph_kvcache_mcp

PACKAGE_DIR = Path(graph_kvcache_mcp.__file__).parent
MAX_LINES = 400


def oversized_modules() -> dict[str, int]:
    sizes = {
        str(path.relative_to(PACKAGE_DIR)): len(path.read_text().splitlines())
        for path in PACKAGE_DIR.rglob("*.py")
    }
    return {module: lines for module, lines in sizes.items() if lines > MAX_LINES}


def test_every_module_holds_at_most_400_lines() -> None:
    assert oversized_modules() == {}
