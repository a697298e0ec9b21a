"""Which managed vLLM depends on the managed `lmcache server` of a data dir, and stopping it
first: vLLM before the server, the order that never hangs vLLM (a worker whose server vanished
waits on it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from graph_kvcache_mcp.connectors.lmcache.state import LmcacheState
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmState
from graph_kvcache_mcp.domain.lmcache.config import MP_CONNECTOR_CLASS

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    pass


def dependent_vllm(data_dir: Path, lmcache_port: int) -> VllmState | None:
    """The running vLLM of `data_dir` whose MP connector talks to the server on `lmcache_port`."""
    state = ManagedVllm(data_dir, tidy=False).running_state()
    if state is None or state.wiring.connector != MP_CONNECTOR_CLASS:
        return None
    return state if state.wiring.lmcache_port == lmcache_port else None


def dependency_reason(data_dir: Path, server: LmcacheState) -> str | None:
    """Why the managed server must not be stopped under a running vLLM, else None."""
    vllm = dependent_vllm(data_dir, server.port)
    if vllm is None:
        return None
    return (
        f"the managed vLLM (pid {vllm.process.pid}, port {vllm.port}) uses this lmcache server "
        f"(pid {server.process.pid}, port {server.port}); stopping the server under it leaves "
        "vLLM's requests and its shutdown waiting on the server"
    )


def stop_dependent_vllm(
    data_dir: Path,
    server: LmcacheState | None,
    *,
    vllm_python: Path | None = None,
    term_wait_s: float = 15.0,
) -> list[str]:
    """Stop the managed vLLM that uses `server` (before the server is stopped); what was done."""
    if server is None or (vllm := dependent_vllm(data_dir, server.port)) is None:
        return []
    how = ManagedVllm(data_dir, python=vllm_python).stop(term_wait_s=term_wait_s).how
    return [f"vLLM pid {vllm.process.pid} on port {vllm.port} ({how}) first"]
