"""httpx is a dependency of the tests and benchmarks only: the package talks HTTP through httpx2,
so installing it must not need httpx (pyproject's `dev` and `bench` extras carry it)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import graph_kvcache_mcp

PACKAGE_DIR = Path(graph_kvcache_mcp.__file__).parent
PYPROJECT = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())


def _imports_httpx(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] == "httpx" for alias in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "httpx":
            return True
    return False


def test_no_module_of_the_package_imports_httpx() -> None:
    importing = [str(path) for path in PACKAGE_DIR.rglob("*.py") if _imports_httpx(path)]
    assert importing == []


def test_httpx_is_in_the_extras_that_use_it_and_not_a_runtime_dependency() -> None:
    def names(requirements: list[str]) -> set[str]:
        return {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in requirements}

    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "httpx" not in names(PYPROJECT["project"]["dependencies"])
    assert {"dev", "bench"} <= {extra for extra, reqs in extras.items() if "httpx" in names(reqs)}
