"""Every module a docstring or comment of the package names exists.

Docstrings point readers at other modules (`connectors.vllm.errors`, `graph_kvcache_mcp.domain.
engine.keys`, `tools/bench_kv.py`); after a move such a pointer dangles silently. This reads each
module's comments and string literals and resolves every such reference against the files.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import graph_kvcache_mcp

PACKAGE_DIR = Path(graph_kvcache_mcp.__file__).parent
REPO_ROOT = PACKAGE_DIR.parent
# Every top-level module and package of ours (`domain`, `config`, `state`...), not only layers.
TOP_LEVEL = "|".join(
    sorted(
        path.stem if path.is_file() else path.name
        for path in PACKAGE_DIR.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    )
)
# Any dotted name under the package, and a backticked one relative to it (`domain.engine.keys`).
ABSOLUTE = re.compile(r"graph_kvcache_mcp(?:\.\w+)+")
RELATIVE = re.compile(rf"`((?:{TOP_LEVEL})(?:\.\w+)+)`")
FILE_SUFFIXES = {"json", "log", "env", "yaml", "toml", "sock", "lock"}
# A file path: inside the package (`connectors/vllm/errors.py`) or the repository's own tools/.
SLASHED = re.compile(rf"(?<![\w./])((?:{TOP_LEVEL})(?:/\w+)+\.py)")


def _comments_and_strings(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [
        (token.start[0], token.string)
        for token in tokens
        if token.type in (tokenize.COMMENT, tokenize.STRING)
    ]


def _defines(module_file: Path, name: str) -> bool:
    pattern = rf"^\s*(?:async def |def |class )?{re.escape(name)}\b"
    return re.search(pattern, module_file.read_text(), re.MULTILINE) is not None


def _resolves(dotted: str) -> bool:
    """A module, or a module and one or two names it defines (`module.Class.method`)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = PACKAGE_DIR.joinpath(*parts[:cut])
        module_file = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module_file.exists():
            rest = parts[cut:]
            return not rest or (len(rest) <= 2 and _defines(module_file, rest[0]))
    return False


def _dotted_resolves(dotted: str) -> bool:
    """A module reference, or a file name that only looks like one (`state.py`, `state.json`)."""
    suffix = dotted.rsplit(".", 1)[-1]
    if suffix == "py":
        return _path_resolves(dotted)
    return suffix in FILE_SUFFIXES or _resolves(dotted)


def _path_resolves(path: str) -> bool:
    return (PACKAGE_DIR / path).exists() or (REPO_ROOT / path).exists()


def dangling_references() -> list[str]:
    dangling = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        where = path.relative_to(REPO_ROOT)
        for line, text in _comments_and_strings(path):
            dotted = [m.group(0).split(".", 1)[1] for m in ABSOLUTE.finditer(text)]
            dotted += [m.group(1) for m in RELATIVE.finditer(text)]
            dangling += [f"{where}:{line}: {ref}" for ref in dotted if not _dotted_resolves(ref)]
            slashed = [m.group(1) for m in SLASHED.finditer(text)]
            dangling += [f"{where}:{line}: {ref}" for ref in slashed if not _path_resolves(ref)]
    return dangling


def test_every_module_a_docstring_or_comment_names_exists() -> None:
    assert dangling_references() == []


def test_a_dangling_reference_is_found() -> None:
    assert _resolves("connectors.vllm.errors.bad_answer")
    assert not _resolves("connectors.vllm_errors")
    assert not _resolves("domain.engine.keys.no_such_name")
    assert _dotted_resolves("config.Settings") and not _dotted_resolves("state.no_such_name")
    assert _dotted_resolves("state.json") and _dotted_resolves("state.py")
    assert not _dotted_resolves("no_such_module.py")
    assert _path_resolves("tools/bench_kv.py") and not _path_resolves("tools/bench_nothing.py")
