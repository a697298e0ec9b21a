"""The seam canary: does a vLLM build still have every private name the project relies on?"""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.connectors.files.package_sources import read_sources
from graph_kvcache_mcp.domain.vllm.seams import SEAMS, SeamResult, check_seams


def check_build(where: Path) -> list[SeamResult]:
    """Every seam's result in the vLLM at `where` (a wheel, or a directory holding `vllm/`).

    Raises:
        ConfigError: `where` is neither.
    """
    return check_seams(read_sources(where, "vllm", {seam.module for seam in SEAMS}))
