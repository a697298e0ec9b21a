"""This host's edge carries the fleet's `tls://` feeds: ensured whenever a fleet command or tool
loads a fleet file that has them, before any feed is read.

Why there and not in a verb of its own: the routes follow from the file alone
(`domain.fleet.feed_routes`), so the operator has nothing to say that the file does not, and a
fleet view whose feeds silently read nothing (no edge) would answer "not live" instead of the
reason. The edge then runs until `edge stop` (as every edge does: it takes no lease), so later
calls find it with the same routes and reuse it. An edge already running with other routes is
refused with what to do (merging routes into a running edge is the edge's job, not the fleet's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.fleet.access import FleetAccess
from graph_kvcache_mcp.domain.edge.routes import EdgeRoutes
from graph_kvcache_mcp.domain.fleet.feed_routes import feed_routes
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet
from graph_kvcache_mcp.errors import ConfigError, EdgeProcessError, InvalidValue
from graph_kvcache_mcp.services import edge

if TYPE_CHECKING:  # zmq and openai load with the first fleet call, not with the server
    from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection

EDGE_READY_TIMEOUT_S = 15.0


def fleet_access(settings: Settings) -> FleetAccess:
    """The fleet access of a server (tools): its edge ensured when the fleet needs one."""
    return FleetAccess(settings, prepare=partial(ensure_feed_edge, settings))


@asynccontextmanager
async def fleet_once(settings: Settings, fleet_file: Path | None) -> AsyncIterator[FleetConnection]:
    """A connection for one CLI command (`FleetAccess.once`), its edge ensured likewise.

    Raises:
        ConfigError: no fleet, a refused fleet file, or an edge that cannot carry its feeds.
    """
    async with FleetAccess.once(
        settings, fleet_file, prepare=partial(ensure_feed_edge, settings)
    ) as conn:
        yield conn


async def ensure_feed_edge(settings: Settings, fleet: Fleet) -> None:
    """Make sure this data dir's edge carries every `tls://` feed of `fleet` (nothing to do
    when it has none).

    Raises:
        ConfigError: haproxy missing, a route of the running edge on a port a feed needs, an
            edge on another TLS dir, a taken port, or not ready: the message says which and
            what to do.

    A running edge (this host is a node or the store too) keeps its routes: the feeds' are
    added, which restarts it once (see `services.edge.ensure_routes`).
    """
    routes = feed_routes(fleet)
    if not routes.outbound or fleet.tls_dir is None:  # parse_fleet: tls:// needs tls_dir
        return
    wanted = EdgeRoutes(outbound=list(routes.outbound))
    try:
        status = await anyio.to_thread.run_sync(
            partial(
                edge.ensure_routes,
                settings,
                Path(fleet.tls_dir),
                wanted,
                ready_timeout_s=EDGE_READY_TIMEOUT_S,
            )
        )
    except (EdgeProcessError, InvalidValue) as exc:
        raise ConfigError(
            f"the fleet's tls:// feeds are read through this host's edge, which cannot carry "
            f"them: {exc}. The feeds need {', '.join(r.spec for r in wanted.outbound)}"
        ) from None
    if not status.reachable:
        raise ConfigError(
            f"this host's edge for the fleet's tls:// feeds is not serving: {status.reason}"
        )
