"""The layering and the subsystems' independence, enforced by reading every module's imports.

docs/architecture.md draws the layers; these rules are that drawing as a check, so an import
that runs upward or ties two subsystems together fails here instead of creeping in.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import graph_kvcache_mcp
from tests.support.vllm import require_vllm_venv

PACKAGE = "graph_kvcache_mcp"
ROOT = Path(graph_kvcache_mcp.__file__).parent

# The older config paths users put in vLLM and LMCache configs: re-exports of the plugins.
OLD_PLUGIN_PATHS = {
    f"{PACKAGE}.connectors.lmcache_l2": f"{PACKAGE}.plugins.lmcache.l2",
    f"{PACKAGE}.connectors.lmcache_remote": f"{PACKAGE}.plugins.lmcache.remote",
    f"{PACKAGE}.connectors.vllm_kv_connector": f"{PACKAGE}.plugins.vllm_kv.connector",
}
ADAPTERS = (
    "tools",
    "commands",
    "server",
    "state",
    "cli",
    "host",
    "__main__",
)
STACK_CONNECTORS = (
    "connectors.engine.process",
    "connectors.lmcache.process",
    "connectors.vllm.process",
    "connectors.stack",
    "connectors.processes",
    "connectors.edge",
)
"""What starts, stops or wires processes: adapters go through services/stack (the edge: through
services/edge, its one door) instead."""
HOST_RUNTIME = tuple(
    f"host.{path.stem}"
    for path in (ROOT / "host").glob("*.py")
    if path.stem not in {"__init__", "catalog"}
)
"""The MCP runtime, apart from the toolset table (a leaf that config reads)."""

# (importer prefix, forbidden prefixes): a module under the first may import none of the second.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("domain", ("connectors", "services", "plugins", "config", *ADAPTERS)),
    ("connectors", ("services", "plugins", *ADAPTERS)),
    ("connectors.processes", ("connectors.engine", "connectors.vllm", "connectors.lmcache")),
    ("connectors.files", ("connectors.engine", "connectors.vllm", "connectors.lmcache")),
    ("connectors.processes", ("connectors.fleet",)),
    ("connectors.files", ("connectors.fleet",)),
    ("connectors.engine", ("connectors.vllm", "connectors.lmcache", "connectors.stack")),
    # the edge is a process of its own: it knows no subsystem, and none of them knows it
    ("connectors.edge", ("connectors.engine", "connectors.vllm", "connectors.lmcache")),
    ("connectors.edge", ("connectors.stack", "connectors.fleet")),
    *((f"connectors.{s}", ("connectors.edge",)) for s in ("engine", "vllm", "lmcache", "stack")),
    ("connectors.vllm", ("connectors.lmcache", "connectors.stack")),
    ("connectors.lmcache", ("connectors.vllm", "connectors.stack")),
    # the fleet spans vLLM instances (and may read the engine), like stack; nothing imports it
    ("connectors.engine", ("connectors.fleet",)),
    ("connectors.vllm", ("connectors.fleet",)),
    ("connectors.lmcache", ("connectors.fleet",)),
    ("connectors.stack", ("connectors.fleet",)),
    ("connectors.fleet", ("connectors.stack",)),
    ("plugins", ("services", *ADAPTERS)),
    ("plugins.vllm_kv", ("plugins.lmcache", "connectors.vllm", "connectors.lmcache")),
    ("plugins.lmcache", ("plugins.vllm_kv", "connectors.vllm", "connectors.lmcache")),
    ("services", ADAPTERS),
    # the MCP runtime knows no tool, verb, use case or I/O: server.py composes it with them
    ("host", ("tools", "commands", "services", "connectors", "plugins", "server", "cli")),
    ("config", ("connectors", "services", "plugins", "state", "tools", "commands", "server")),
    ("config", ("cli", *HOST_RUNTIME)),
    # model fixtures build from nothing of ours, and only the demo verb uses them in production
    ("fixtures", ("domain", "connectors", "services", "plugins", "config", *ADAPTERS)),
    *((layer, ("fixtures",)) for layer in ("domain", "connectors", "services", "plugins", "tools")),
)


def imported_modules(source: str, module: str) -> set[str]:
    """Every module of this package that `source` (the text of `module`) imports, absolute."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


def violations(module: str, imports: set[str]) -> list[str]:
    """The rules `module` breaks by importing `imports`."""
    local = module.removeprefix(PACKAGE + ".")
    broken = []
    for importer, forbidden in RULES:
        if not (local == importer or local.startswith(importer + ".")):
            continue
        for name in sorted(imports):
            target = name.removeprefix(PACKAGE + ".")
            for prefix in forbidden:
                if target == prefix or target.startswith(prefix + "."):
                    broken.append(f"{module} imports {name} ({importer} must not use {prefix})")
    return broken


def package_modules() -> dict[str, str]:
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path.read_text()
    return modules


def test_no_module_breaks_a_layer_or_ties_two_subsystems_together() -> None:
    broken = [
        line
        for module, source in package_modules().items()
        if module not in OLD_PLUGIN_PATHS
        for line in violations(module, imported_modules(source, module))
    ]
    assert broken == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("graph_kvcache_mcp.domain.keys", "from graph_kvcache_mcp.connectors.engine import client"),
        (
            "graph_kvcache_mcp.connectors.vllm.x",
            "import graph_kvcache_mcp.connectors.lmcache.process",
        ),
        ("graph_kvcache_mcp.plugins.vllm_kv.x", "from graph_kvcache_mcp.state import AppState"),
        ("graph_kvcache_mcp.connectors.engine.x", "from ...services import kv_probe"),
        ("graph_kvcache_mcp.services.x", "from graph_kvcache_mcp import tools"),
        ("graph_kvcache_mcp.connectors.vllm.x", "from ..fleet import feed"),
        ("graph_kvcache_mcp.domain.fleet.x", "import zmq, graph_kvcache_mcp.connectors.fleet"),
        ("graph_kvcache_mcp.host.x", "from graph_kvcache_mcp.tools import kv"),
        ("graph_kvcache_mcp.config", "from graph_kvcache_mcp.host.strict_server import X"),
        ("graph_kvcache_mcp.connectors.vllm.x", "from graph_kvcache_mcp.host import jsonrpc"),
    ],
)
def test_the_check_catches_a_violating_import(module: str, source: str) -> None:
    assert violations(module, imported_modules(source, module)) != []


def test_no_subpackage_holds_more_than_fifteen_modules() -> None:
    crowded = {
        str(folder.relative_to(ROOT)): count
        for folder in [ROOT, *(p for p in ROOT.rglob("*") if p.is_dir())]
        if (count := len([f for f in folder.glob("*.py") if f.name != "__init__.py"])) > 15
    }
    assert crowded == {}


PUBLIC_NAMES = {
    "lmcache_l2": ["EngineL2Client"],
    "lmcache_remote": ["params_from_extra_config", "core_from_params"],
    "vllm_kv_connector": ["EngineKVConnector", "EngineKVMetadata"],
}
SAME_OBJECTS = """
import importlib, sys
old, new = importlib.import_module(sys.argv[1]), importlib.import_module(sys.argv[2])
for name in sys.argv[3:]:
    assert getattr(old, name) is getattr(new, name), name
print("same")
"""


@pytest.mark.parametrize(("old", "new"), sorted(OLD_PLUGIN_PATHS.items()))
def test_old_plugin_paths_are_thin_reexports(old: str, new: str) -> None:
    # The vLLM connector imports vLLM and torch, so that pair is checked in vLLM's own venv.
    python = str(require_vllm_venv()) if "vllm_kv" in new else sys.executable
    names = PUBLIC_NAMES[old.rsplit(".", 1)[1]]
    done = subprocess.run(
        [python, "-c", SAME_OBJECTS, old, new, *names],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout.strip() == "same", done.stderr[-2000:]


def test_the_package_exports_exactly_its_public_surface() -> None:
    assert sorted(graph_kvcache_mcp.__all__) == [
        "ConfigError",
        "EngineProcessError",
        "GraphKvcacheError",
        "Hit",
        "InvalidKey",
        "InvalidValue",
        "KvClient",
        "Miss",
        "Presence",
        "ProcessError",
        "Stored",
        "SyncKvClient",
        "Unavailable",
        "VllmProcessError",
        "__version__",
    ]
    for name in graph_kvcache_mcp.__all__:
        assert hasattr(graph_kvcache_mcp, name)


def test_the_toolset_table_is_a_leaf_that_config_can_read() -> None:
    source = (ROOT / "host" / "catalog.py").read_text()
    assert imported_modules(source, f"{PACKAGE}.host.catalog") == set()


def test_adapters_reach_the_managed_processes_only_through_the_stack_service() -> None:
    reaching = {
        module.removeprefix(PACKAGE + "."): sorted(
            name.removeprefix(PACKAGE + ".")
            for name in imported_modules(source, module)
            if any(
                name.removeprefix(PACKAGE + ".") == prefix
                or name.removeprefix(PACKAGE + ".").startswith(prefix + ".")
                for prefix in STACK_CONNECTORS
            )
        )
        for module, source in package_modules().items()
        if module.removeprefix(PACKAGE + ".").startswith(("tools.", "commands."))
    }
    assert {module: names for module, names in reaching.items() if names} == {}


def test_services_reach_the_managed_processes_only_through_the_stack_service() -> None:
    reaching = {
        module.removeprefix(PACKAGE + "."): names
        for module, source in package_modules().items()
        if module.removeprefix(PACKAGE + ".").startswith(("services.", "state"))
        and not module.removeprefix(PACKAGE + ".").startswith(("services.stack", "services.edge"))
        if (names := _stack_connectors_in(imported_modules(source, module)))
    }
    assert reaching == {}


def test_the_mcp_runtime_imports_nothing_of_the_app_outside_itself() -> None:
    reaching = {
        module: sorted(
            name
            for name in imported_modules(source, module)
            if not _is_host(name)
            and name != f"{PACKAGE}.errors"
            and not name.startswith(f"{PACKAGE}.errors.")
        )
        for module, source in package_modules().items()
        if _is_host(module)
    }
    assert {module: names for module, names in reaching.items() if names} == {}


def _stack_connectors_in(imports: set[str]) -> list[str]:
    local = (name.removeprefix(PACKAGE + ".") for name in imports)
    return sorted(
        name
        for name in local
        if any(name == prefix or name.startswith(prefix + ".") for prefix in STACK_CONNECTORS)
    )


def _is_host(name: str) -> bool:
    return name == f"{PACKAGE}.host" or name.startswith(f"{PACKAGE}.host.")
