"""Every MCP Inspector recipe in the docs and examples is pinned to the version checked to work,
and the docs state its Node requirement (#39 item 6): an unpinned `npx` on Node 20 resolves to an
old release that breaks the recipes."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PINNED = "@modelcontextprotocol/inspector@2.12.0"
PAGES = [REPO / "README.md", REPO / "examples" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RECIPE = re.compile(r"npx [^\n`]*@modelcontextprotocol/inspector\S*")


def test_every_inspector_recipe_is_pinned() -> None:
    recipes = [
        (str(page.relative_to(REPO)), match.group(0))
        for page in PAGES
        for match in RECIPE.finditer(page.read_text(encoding="utf-8"))
    ]
    assert len(recipes) >= 5
    unpinned = [(page, recipe) for page, recipe in recipes if not recipe.endswith(PINNED)]
    assert unpinned == []


def test_the_docs_state_the_inspector_s_node_requirement() -> None:
    for page in (REPO / "README.md", REPO / "docs" / "mcp-server.md"):
        text = page.read_text(encoding="utf-8")
        assert "Node ≥ 22.19" in text and "Node 20" in text, page
