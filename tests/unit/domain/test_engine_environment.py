"""The engine's token variable is named once (`domain/engine/environment.py`): every other module
imports the name, so renaming it is one edit and no module can drift from the others."""

from __future__ import annotations

import ast
from pathlib import Path

import graph_kvcache_mcp
from graph_kvcache_mcp.domain.engine import environment
from graph_kvcache_mcp.domain.engine.environment import KV_TOKEN_ENV, KV_TOKEN_REF

ROOT = Path(graph_kvcache_mcp.__file__).parent
DECLARED_IN = Path(environment.__file__)


def _docstrings(tree: ast.AST) -> set[int]:
    """The string statements of a module, class or function body (docstrings, attribute notes)."""
    bodies = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(statement.value)
        for node in ast.walk(tree)
        if isinstance(node, bodies)
        for statement in node.body
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
    }


def _literals_naming(name: str, path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    prose = _docstrings(tree)
    return [
        f"{path.relative_to(ROOT.parent)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and name in node.value
        and id(node) not in prose
    ]


def test_only_the_declaration_spells_the_token_variable_in_code() -> None:
    spelled = [
        where
        for path in sorted(ROOT.rglob("*.py"))
        if path != DECLARED_IN
        for where in _literals_naming(KV_TOKEN_ENV, path)
    ]
    assert spelled == []
    assert _literals_naming(KV_TOKEN_ENV, DECLARED_IN) != []  # the guard sees a literal at all


def test_a_plan_refers_to_the_token_by_the_declared_name() -> None:
    assert KV_TOKEN_REF == "${" + KV_TOKEN_ENV + "}"
