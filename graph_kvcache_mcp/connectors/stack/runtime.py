"""How the vLLM this data dir manages was started: its KV connector and the lmcache server its MP
connector talks to (its recorded `KvWiring`), its platform, and its PYTHONHASHSEED and
LMCACHE_MP_TRANSFER_MODE (from the process's environment, read for those names only); and how
the managed `lmcache server` runs: its seed, transfer mode, port, whether its log shows a
registration it cannot serve, and whether its resp adapter lost its engine. Plus the
`/dev/shm/lmcache_kv_<pid>_*` segments that exited vLLMs left behind."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Literal

import psutil
from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.processes.control import tail
from graph_kvcache_mcp.connectors.processes.identity import environment_value
from graph_kvcache_mcp.connectors.processes.ports import port_in_use
from graph_kvcache_mcp.connectors.processes.shared_memory import SHM_DIR
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm

REGISTRATION_HANG = "No handler registered for operation register_kv_cache_engine_driven_context"
_SEGMENT = re.compile(r"^lmcache_kv_(\d+)_\d+$")


class ManagedRuntime(BaseModel):
    model_config = ConfigDict(frozen=True)

    base_url: str
    kv_connector: str | None
    hash_seed: str | None
    platform: Literal["cpu", "gpu"] | None = None
    lmcache_target: str | None = None
    lmcache_target_answers: bool | None = None
    lmcache_transfer_mode: str | None = None


class LmcacheRuntime(BaseModel):
    """How an lmcache server runs: all of it for ours; for another, what its API reported
    (transfer mode, port) and `not_readable`, what lives with its process and why it is not
    read here."""

    model_config = ConfigDict(frozen=True)

    hash_seed: str | None = None
    transfer_mode: str | None = None
    rpc_port: int | None = None
    registration_hang: str | None = None
    resp_peer_gone: str | None = None
    not_readable: str | None = None


def managed_vllm_runtime(data_dir: Path) -> ManagedRuntime | None:
    """The running vLLM we started from `data_dir` (checked by pid and start time), else None."""
    state = ManagedVllm(data_dir, tidy=False).running_state()  # a diagnosis changes nothing
    if state is None:
        return None
    target = state.wiring.lmcache_target
    answers = None
    if target is not None and target.startswith("ipc://"):
        answers = _unix_socket_answers(target.removeprefix("ipc://"))
    elif target is not None:
        host, _, port = target.rpartition(":")
        answers = port.isdigit() and port_in_use(host, int(port))
    return ManagedRuntime(
        base_url=state.base_url,
        kv_connector=state.wiring.connector,
        hash_seed=environment_value(state.process.pid, "PYTHONHASHSEED"),
        platform=state.platform.kind,
        lmcache_target=target,
        lmcache_target_answers=answers,
        lmcache_transfer_mode=environment_value(state.process.pid, "LMCACHE_MP_TRANSFER_MODE"),
    )


def managed_lmcache_runtime(data_dir: Path, http_url: str) -> LmcacheRuntime | None:
    """How the `lmcache server` we started from `data_dir` runs, when it is the one at
    `http_url`; None otherwise (another server's environment and log are not ours to read)."""
    managed = ManagedLmcache(data_dir)
    state = managed.running_state(tidy=False)  # a diagnosis changes nothing
    if state is None or state.http_url.rstrip("/") != http_url.rstrip("/"):
        return None
    hang = [line for line in tail(managed.log_path, 200).splitlines() if REGISTRATION_HANG in line]
    return LmcacheRuntime(
        hash_seed=environment_value(state.process.pid, "PYTHONHASHSEED"),
        transfer_mode=state.wiring.transfer_mode,
        rpc_port=state.port,
        registration_hang=hang[-1].strip()[-300:] if hang else None,
        resp_peer_gone=managed.status(tidy=False).resp_peer_gone,
    )


def managed_lmcache_hash_seed(data_dir: Path, http_url: str) -> str | None:
    """PYTHONHASHSEED of the `lmcache server` we started from `data_dir`, when it is the one at
    `http_url`; None otherwise."""
    runtime = managed_lmcache_runtime(data_dir, http_url)
    return None if runtime is None else runtime.hash_seed


def leaked_lmcache_segments(shm_dir: Path = SHM_DIR) -> list[str]:
    """`lmcache_kv_<pid>_*` segments in `shm_dir` whose process no longer runs (what vLLM's
    lmcache_driven transfer mode leaves on CPU)."""
    try:
        names = sorted(entry.name for entry in shm_dir.iterdir())
    except OSError:
        return []
    return [
        name
        for name in names
        if (match := _SEGMENT.match(name)) and not psutil.pid_exists(int(match.group(1)))
    ]


def _unix_socket_answers(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(2.0)
            conn.connect(path)
    except OSError:
        return False
    return True
