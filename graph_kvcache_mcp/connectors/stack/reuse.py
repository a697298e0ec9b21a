"""Whether the running managed vLLM and `lmcache server` match a new stack start: a start
reuses them only when they run with the planned KV tier, server and flags."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.lmcache.config import MP_CONNECTOR_CLASS, ProcessSpec
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.errors import LmcacheProcessError, VllmProcessError

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    pass


def check_vllm_reusable(managed: ManagedVllm, launch: VllmLaunch) -> None:
    """Refuse a start when our running vLLM was started with another KV tier or server.

    Raises:
        VllmProcessError: says what runs and how to replace it.
    """
    state = managed.running_state()
    if state is None:
        return
    connector, port = state.wiring.connector, state.wiring.lmcache_port
    if connector == MP_CONNECTOR_CLASS and port == launch.lmcache_port:
        return
    runs = f"KV connector {connector}" if connector else "no KV connector"
    if connector == MP_CONNECTOR_CLASS:
        runs += f" to the lmcache server on port {port}"
    raise VllmProcessError(
        f"a vLLM started from {managed.data_dir} already runs (pid {state.process.pid}, port "
        f"{state.port}) with {runs}, not kv_connector {launch.kv_connector} on lmcache port "
        f"{launch.lmcache_port}; stop it first with vllm_stop (CLI: graph-kvcache-mcp vllm stop)"
    )


def check_lmcache_reusable(managed: ManagedLmcache, server: ProcessSpec) -> None:
    """Refuse a start when our running server was started with other flags than planned.

    Raises:
        LmcacheProcessError: names the flags that differ.
    """
    state = managed.running_state(tidy=False)
    if state is None:
        return
    running = state.wiring.args
    if running == server.argv[1:]:
        return
    differ = sorted(set(_flags(running)) ^ set(_flags(server.argv[1:])))
    raise LmcacheProcessError(
        f"the lmcache server started from {managed.data_dir} (pid {state.process.pid}, port "
        f"{state.port}) runs with other settings than this stack plans (differing: "
        f"{', '.join(differ) or 'flag order'}); stop it with lmcache_stop (CLI: graph-kvcache-mcp "
        "lmcache stop) and start again"
    )


def _flags(args: list[str]) -> list[str]:
    """`--flag value` pairs as one string each, for naming what differs."""
    pairs: list[str] = []
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        value = args[index + 1] if index + 1 < len(args) else ""
        pairs.append(arg if value.startswith("--") or not value else f"{arg} {value}")
    return pairs
