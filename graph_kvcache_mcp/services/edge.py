"""The host's TLS edge, the one door adapters use to reach it (`connectors/edge`): start it with
its routes, report it, rotate its certificate, stop it.

The edge is no part of the managed stack (`services/stack`): nothing of the stack starts or
stops it, and it takes no leases; it runs until `edge stop`. Its models are the connector's
(`connectors/edge/state.py`), as the other managed processes' are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.edge.process import DEFAULT_READY_TIMEOUT_S, ManagedEdge
from graph_kvcache_mcp.connectors.edge.state import (
    EdgeRotateOut,
    EdgeStatus,
    EdgeStopResult,
)
from graph_kvcache_mcp.domain.edge.routes import EdgeRoutes, Route, routes_of

__all__ = [
    "EdgeRotateOut",
    "EdgeStatus",
    "EdgeStopResult",
    "edge_status",
    "ensure_routes",
    "rotate",
    "start",
    "start_routes",
    "stop",
    "withdraw_routes",
]


def start(
    settings: Settings,
    *,
    inbound: list[str],
    outbound: list[str],
    tls_dir: Path,
    ready_timeout_s: float,
) -> EdgeStatus:
    """Start (or reuse) this data dir's edge with the routes the CLI gives.

    Raises:
        InvalidValue: a malformed route (before anything starts).
        ConfigError: the TLS dir cannot be used.
        EdgeProcessError: haproxy missing or the edge did not come up (see `ManagedEdge.start`).
    """
    return start_routes(
        settings, routes_of(inbound, outbound), tls_dir=tls_dir, ready_timeout_s=ready_timeout_s
    )


def start_routes(
    settings: Settings, routes: EdgeRoutes, *, tls_dir: Path, ready_timeout_s: float
) -> EdgeStatus:
    """Start (or reuse: same routes) this data dir's edge with typed `routes` (a fleet file's).

    Raises:
        ConfigError: the TLS dir cannot be used.
        EdgeProcessError: haproxy missing, an edge with other routes running, a listener taken
            or not ready (see `ManagedEdge.start`).
    """
    return ManagedEdge(settings.data_dir).start(routes, tls_dir, ready_timeout_s=ready_timeout_s)


def ensure_routes(
    settings: Settings,
    tls_dir: Path,
    routes: EdgeRoutes,
    *,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> EdgeStatus:
    """Make this data dir's edge carry `routes`, for a command that publishes a service or
    reaches a peer (the store's engine and coordinator, a node's feeds): the edge is started
    with them when none runs, reused (`reused`) when it carries them already, and otherwise
    restarted with the union of its routes and these (`restarted`: every connection through it
    was dropped; haproxy reloads are avoided on purpose, see docs/multi-host.md). Build `routes`
    with `domain.edge.routes` (`EdgeRoutes`, `parse_inbound`, `parse_outbound`) or
    `domain.edge.store`.

    Raises:
        ConfigError: the running edge uses another TLS dir, or `tls_dir` cannot be used.
        InvalidValue: one of `routes` listens where a different route of the edge does.
        EdgeProcessError: haproxy missing, a listener taken, or the edge not ready in time.
    """
    edge = ManagedEdge(settings.data_dir)
    return edge.ensure(routes, tls_dir, ready_timeout_s=ready_timeout_s)


def withdraw_routes(
    settings: Settings,
    unwanted: Callable[[Route], bool],
    *,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> EdgeStatus | None:
    """Drop the routes `unwanted` picks from this data dir's edge (restarted with the rest, or
    stopped when none is left); None when no edge runs or none of its routes is picked.

    Raises:
        EdgeProcessError: the restarted edge did not come up.
    """
    edge = ManagedEdge(settings.data_dir)
    return edge.withdraw(unwanted, ready_timeout_s=ready_timeout_s)


def edge_status(settings: Settings) -> EdgeStatus:
    return ManagedEdge(settings.data_dir).status()


def stop(settings: Settings, *, wait_s: float) -> EdgeStopResult:
    return ManagedEdge(settings.data_dir).stop(term_wait_s=wait_s)


def rotate(settings: Settings, *, tls_dir: Path) -> EdgeRotateOut:
    """Serve the certificate in `tls_dir` without a reload (see `ManagedEdge.rotate`)."""
    return ManagedEdge(settings.data_dir).rotate(tls_dir)
