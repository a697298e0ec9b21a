"""The managed engine from the CLI (`engine start|stop|status`): it runs until `engine stop`.
A server session reaches the same engine through its KV access (`state.py`) instead."""

from __future__ import annotations

from collections.abc import Callable

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine, engine_binary
from graph_kvcache_mcp.connectors.engine.state import Backend, EngineStatus, EngineStopResult


def start_engine(
    settings: Settings,
    *,
    port: int | None,
    backend: Backend | None,
    ready_timeout_s: float,
    progress: Callable[[str], None] | None = None,
    resp: bool = False,
) -> EngineStatus:
    """Start (or reuse) the data dir's engine; the settings fill in what is not given.

    Raises:
        EngineProcessError: it could not start; the message quotes the engine's reason.
    """
    return ManagedEngine(settings.data_dir).start(
        port=port or settings.engine_port,
        backend=backend or settings.engine_backend,
        ready_timeout_s=ready_timeout_s,
        progress=progress,
        resp=resp,
    )


def stop_engine(settings: Settings, *, wait_s: float) -> EngineStopResult:
    """Stop the engine this data dir started, even while sessions use it."""
    return ManagedEngine(settings.data_dir).stop(term_wait_s=wait_s)


def engine_status(settings: Settings) -> EngineStatus:
    """Whether the data dir's engine runs and answers, and which sessions use it."""
    return ManagedEngine(settings.data_dir).status()


def check_engine_installed() -> None:
    """Nothing, when the engine package and its binary are installed.

    Raises:
        EngineProcessError: they are not; the message gives the install command.
    """
    engine_binary()
