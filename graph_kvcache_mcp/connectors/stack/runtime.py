"""How the vLLM this data dir manages was started: its KV connector (from the recorded command)
and its PYTHONHASHSEED (from the process's environment, read for that one name only); and the
PYTHONHASHSEED of the managed `lmcache server`, read the same way."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm

KV_TRANSFER_FLAG = "--kv-transfer-config"


class ManagedRuntime(BaseModel):
    model_config = ConfigDict(frozen=True)

    base_url: str
    kv_connector: str | None
    hash_seed: str | None


def managed_vllm_runtime(data_dir: Path) -> ManagedRuntime | None:
    """The running vLLM we started from `data_dir` (checked by pid and start time), else None."""
    state = ManagedVllm(data_dir, tidy=False).running_state()  # a diagnosis changes nothing
    if state is None:
        return None
    return ManagedRuntime(
        base_url=state.base_url,
        kv_connector=kv_connector_of(state.process.command),
        hash_seed=environment_value(state.process.pid, "PYTHONHASHSEED"),
    )


def managed_lmcache_hash_seed(data_dir: Path, http_url: str) -> str | None:
    """PYTHONHASHSEED of the `lmcache server` we started from `data_dir`, when it is the one at
    `http_url`; None otherwise (another server's environment is not ours to read)."""
    state = ManagedLmcache(data_dir).running_state(tidy=False)  # a diagnosis changes nothing
    if state is None or state.http_url.rstrip("/") != http_url.rstrip("/"):
        return None
    return environment_value(state.process.pid, "PYTHONHASHSEED")


def environment_value(pid: int, name: str) -> str | None:
    """One variable of a process's environment (Linux /proc); None when unset or unreadable.
    Only `name` is kept: the rest (keys, tokens) is never returned."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def kv_connector_of(command: tuple[str, ...]) -> str | None:
    """The `kv_connector` named by a command's --kv-transfer-config, None without one."""
    value = transfer_config_text(command)
    if value is None:
        return None
    try:
        config = json.loads(value)
    except ValueError:
        return "unparsed --kv-transfer-config"
    return str(config.get("kv_connector")) if isinstance(config, dict) else None


def lmcache_port_of(command: tuple[str, ...]) -> int | None:
    """The `lmcache.mp.port` a command's --kv-transfer-config points LMCache's MP connector at."""
    value = transfer_config_text(command)
    if value is None:
        return None
    try:
        return int(json.loads(value)["kv_connector_extra_config"]["lmcache.mp.port"])
    except (ValueError, TypeError, KeyError):
        return None


def transfer_config_text(command: tuple[str, ...]) -> str | None:
    """The raw value of a command's --kv-transfer-config (either spelling), None without one."""
    for index, arg in enumerate(command):
        if arg == KV_TRANSFER_FLAG and index + 1 < len(command):
            return command[index + 1]
        if arg.startswith(KV_TRANSFER_FLAG + "="):
            return arg.split("=", 1)[1]
    return None
