"""The docs say what the code does about toolsets (#39 item 7): the default list a page states is
`host/catalog.py`'s, a recommended `GRAPH_KVCACHE_TOOLSETS` keeps every default toolset (a list
that silently dropped `compat` and `toolsets` lost `graph_kvcache` and run-time enabling), and
the examples install the engine they all need."""

from __future__ import annotations

import re
from pathlib import Path

from graph_kvcache_mcp.host.catalog import DEFAULT_TOOLSETS, TOOLSETS

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "examples" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLES = sorted((REPO / "examples").rglob("*.json"))
VALUE = re.compile(r"GRAPH_KVCACHE_TOOLSETS\"?\s*[=:]\s*\"?([a-z_]+(?:,[a-z_]+)*)")
DEFAULT_ROW = re.compile(
    r"^\|[^\n]*`GRAPH_KVCACHE_TOOLSETS`[^\n]*?`([a-z_]+(?:,[a-z_]+)+)`", re.MULTILINE
)
DROPS_COMPAT_ON_PURPOSE = {"docs/mcp-server.md"}
"""The page that shows how to leave `compat` out, saying what that costs."""


def _where(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_every_default_toolsets_row_in_the_docs_lists_the_code_s_defaults() -> None:
    found = [
        (_where(page), match.group(1))
        for page in PAGES
        for match in DEFAULT_ROW.finditer(page.read_text(encoding="utf-8"))
    ]
    assert found, "no docs row states the default toolsets"
    wrong = [(page, value) for page, value in found if tuple(value.split(",")) != DEFAULT_TOOLSETS]
    assert wrong == [], f"the default toolsets are {','.join(DEFAULT_TOOLSETS)}"


def test_every_recommended_toolsets_value_keeps_the_defaults() -> None:
    dropped = []
    for path in [*PAGES, *EXAMPLES]:
        for match in VALUE.finditer(path.read_text(encoding="utf-8")):
            named = set(match.group(1).split(","))
            assert named <= set(TOOLSETS), (_where(path), match.group(0))
            missing = set(DEFAULT_TOOLSETS) - named
            if _where(path) in DROPS_COMPAT_ON_PURPOSE:
                missing -= {"compat"}
            if missing:
                dropped.append((_where(path), match.group(0), sorted(missing)))
    assert dropped == []


def test_the_examples_install_the_engine_extra_they_all_need() -> None:
    text = (REPO / "examples" / "README.md").read_text(encoding="utf-8")
    installs = re.findall(r"pip install [^`\n]*", text)
    assert installs and all("[engine]" in command for command in installs), installs
