"""The server's working directory as the implicit file root, and whether it is too broad for one
(the rule is `domain.file_roots.broad_working_dir`; this module only looks at the disk)."""

from __future__ import annotations

import os
from pathlib import Path

from graph_kvcache_mcp.domain.file_roots import broad_working_dir, broad_working_dir_refusal


def implicit_root() -> tuple[Path, str | None]:
    """The working directory (symlinks followed), and why it may not serve as the implicit root
    when it is `/`, the home directory or above it (None: it may)."""
    cwd = Path(os.path.realpath(Path.cwd()))
    opens = broad_working_dir(cwd, Path(os.path.realpath(Path.home())))
    return cwd, None if opens is None else broad_working_dir_refusal(cwd, opens)
