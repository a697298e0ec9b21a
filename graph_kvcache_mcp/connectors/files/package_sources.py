"""A Python package's module sources, read from a wheel or an install without importing it.

A wheel for another platform (vLLM's CUDA build on a CPU host) cannot be imported, but its
sources can be read: the vLLM seam canary (`domain/vllm/seams.py`) checks them.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable
from pathlib import Path

from graph_kvcache_mcp.errors import ConfigError

MAX_SOURCE_BYTES = 4 * 1024 * 1024
"""No module we read comes near this; a larger member is not a source file we read."""


def read_sources(where: Path, package: str, modules: Iterable[str]) -> dict[str, str | None]:
    """`modules` (paths such as `vllm/v1/request.py`) from the wheel file `where`, or from the
    directory `where` that holds `package` (a site-packages) or is it; None for a missing one.

    Raises:
        ConfigError: `where` is neither a wheel nor a directory holding `package`.
    """
    wanted = sorted(set(modules))
    if where.is_file() and where.suffix == ".whl":
        return _from_wheel(where, wanted)
    if where.name == package and (where / "__init__.py").is_file():
        where = where.parent
    if (where / package / "__init__.py").is_file():
        return {m: _read_file(where / m) for m in wanted}
    raise ConfigError(
        f"{where} is neither a wheel (.whl) nor a directory holding the {package} package: "
        "give a wheel or a site-packages directory"
    )


def _from_wheel(wheel: Path, modules: list[str]) -> dict[str, str | None]:
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            out: dict[str, str | None] = {}
            for module in modules:
                info = archive.getinfo(module) if module in names else None
                if info is None or info.file_size > MAX_SOURCE_BYTES:
                    out[module] = None
                    continue
                out[module] = archive.read(info).decode("utf-8", errors="replace")
            return out
    except zipfile.BadZipFile as exc:
        raise ConfigError(f"{wheel} is not a readable wheel: {exc}") from exc


def _read_file(path: Path) -> str | None:
    if not path.is_file() or path.stat().st_size > MAX_SOURCE_BYTES:
        return None
    return path.read_text(encoding="utf-8", errors="replace")
