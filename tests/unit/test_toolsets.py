"""Every toolset module satisfies `Toolset`, and both registrars satisfy `Registrar`.

The assignments below are what mypy checks (it runs over tests in CI): a toolset whose
`register` wants more of the server than `Registrar` offers fails the type check here.
"""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.host.catalog import TOOLSET_MODULES
from graph_kvcache_mcp.host.registrar import Registrar, Toolset
from graph_kvcache_mcp.server import RefusingRegistrar, build_server
from graph_kvcache_mcp.tools import (
    bundle,
    cache,
    compat,
    diagnose,
    engine,
    fleet,
    kv,
    lmcache,
    vllm,
)

TOOLSETS: dict[str, Toolset] = {
    "kv": kv,
    "engine": engine,
    "bundle": bundle,
    "vllm": vllm,
    "lmcache": lmcache,
    "diagnose": diagnose,
    "fleet": fleet,
    "cache": cache,
    "compat": compat,
}


def test_every_registered_toolset_module_is_checked_here_under_its_own_name() -> None:
    assert {name: module.TOOLSET for name, module in TOOLSETS.items()} == {
        name: name for name in TOOLSET_MODULES
    }
    assert {name: module.__name__ for name, module in TOOLSETS.items()} == TOOLSET_MODULES  # type: ignore[attr-defined]


def test_the_server_and_its_refusing_stand_in_are_registrars(tmp_path: Path) -> None:
    server = build_server(Settings.build(data_dir=tmp_path, kv_url="http://127.0.0.1:9"))
    registrars: list[Registrar] = [server, RefusingRegistrar(server, "refused for the test")]
    assert [r.live_state() for r in registrars] == [None, None]  # no lifespan runs yet
