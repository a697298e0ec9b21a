"""Which processes of ours use the data dir's managed engine as their KV tier.

The children we start for it (the `lmcache server`, vLLM) carry `ENGINE_DIR_VARIABLE` naming the
data dir; only their owner can read a process's environment, so a stranger cannot pose as one.
`engine stop` asks before it stops the engine, so it can refuse and name them instead of leaving
them to fail on their next request.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from graph_kvcache_mcp.connectors.engine.children.proof import ENGINE_DIR_VARIABLE
from graph_kvcache_mcp.connectors.processes.identity import environment_value


def engine_dependents(data_dir: Path) -> list[str]:
    """'pid N (name)' of each of our processes started to use `data_dir`'s engine (a worker
    that inherited the variable from a listed parent is not listed again)."""
    wanted = str(data_dir.expanduser().resolve())
    me = os.getpid()
    found: dict[int, tuple[int, str]] = {}
    for process in psutil.process_iter(["pid", "ppid", "name", "uids"]):
        info = process.info
        uids = info.get("uids")
        if info["pid"] == me or uids is None or uids.effective != os.geteuid():
            continue
        named = environment_value(info["pid"], ENGINE_DIR_VARIABLE)
        if named is not None and str(Path(named).expanduser().resolve()) == wanted:
            found[info["pid"]] = (info["ppid"], info["name"] or "?")
    listed = sorted(found.items())
    return [f"pid {pid} ({name})" for pid, (parent, name) in listed if parent not in found]


def dependents_refusal(data_dir: Path) -> str | None:
    """Why the engine must not be stopped now, or None when nothing of ours depends on it."""
    users = engine_dependents(data_dir)
    if not users:
        return None
    return (
        f"the managed engine of {data_dir} is the KV tier of {', '.join(users)}: stop them first "
        "(`graph-kvcache-mcp vllm stop`, `graph-kvcache-mcp lmcache stop`), or pass force=true "
        "to stop it anyway (they then send nothing until an engine of this data dir runs again)"
    )
