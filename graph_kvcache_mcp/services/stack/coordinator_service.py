"""`lmcache coordinator start|status|stop`: LMCache's coordinator as a managed service of its own
(the store host's, issue #37), published on this host's edge when asked.

It is the data dir's one managed coordinator (`connectors/lmcache/coordinator_process.py`, the
one `vllm start --coordinator managed` starts or joins): on loopback, behind the owner-only
filter (the edge runs as our user, so what it forwards passes), its listener proven ours. Started
here it runs until `lmcache coordinator stop`; the stop of a server that joined it leaves it.
`--listen` adds the edge's inbound route to it, each `--node` the outbound route the coordinator
reaches that node's lmcache server through (`domain/edge/store.py`); a later start with more
nodes adds their routes to the same edge.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from pydantic import Field

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import CoordinatorState
from graph_kvcache_mcp.connectors.processes.status import ProcessStatus, StopResult, running_fields
from graph_kvcache_mcp.domain.edge.routes import EdgeRoutes, Route
from graph_kvcache_mcp.domain.edge.store import callback_node, callback_route, parse_node
from graph_kvcache_mcp.errors import InvalidValue
from graph_kvcache_mcp.services import edge
from graph_kvcache_mcp.services.edge import EdgeStatus
from graph_kvcache_mcp.services.stack.stack import Stack
from graph_kvcache_mcp.services.stack.store_host import (
    StoreJoin,
    check_publication,
    publish,
    published_join,
    routes_to,
    withdrawn_note,
)


class CoordinatorServiceStatus(ProcessStatus):
    """`lmcache coordinator start|status`."""

    reachable: bool = Field(False, description="It holds its loopback port and answers.")
    url: str | None = Field(None, description="Its loopback URL (our own user only).")
    chunk_size: int | None = None
    hash_algorithm: str | None = None
    runs_until_stop: bool | None = Field(
        None,
        description="True: runs until `lmcache coordinator stop`; false: it was started for a "
        "server and stops with it.",
    )
    published: str | None = Field(
        None, description="host:port where the edge serves it (mutual TLS)."
    )
    nodes: list[str] = Field(
        default_factory=list,
        description="NAME@IP:PORT of each node the edge carries its callbacks to.",
    )
    edge_restarted: bool = Field(
        False,
        description="This start restarted the edge to add routes: its connections were dropped.",
    )
    join: StoreJoin | None = None


class CoordinatorServiceStop(StopResult):
    """`lmcache coordinator stop`, and what became of its routes on the edge."""

    edge: str | None = Field(None, description="What happened to the edge (its routes removed).")


def start_coordinator_service(
    settings: Settings,
    *,
    python: Path | None,
    chunk_size: int,
    hash_algorithm: str,
    ready_timeout_s: float,
    listen: str | None,
    tls_dir: Path | None,
    nodes: list[str],
) -> CoordinatorServiceStatus:
    """Start (or adopt) the data dir's coordinator until `lmcache coordinator stop`; publish it
    at `listen` and route its callbacks to `nodes` on the edge. Flags are checked before
    anything starts; a failed publication stops the coordinator again when this call started it.

    Raises:
        InvalidValue: a malformed flag, one flag without its partner, an address the
            certificate does not name, or a port taken.
        ConfigError: the TLS dir cannot be used.
        LmcacheProcessError: the coordinator did not start, or one runs that hashes otherwise.
        EdgeProcessError: the edge did not come up.
    """
    parsed = [parse_node(node) for node in nodes]
    if parsed and tls_dir is None:
        raise InvalidValue(
            "--node needs --tls-dir: the coordinator reaches a node through this host's edge, "
            "with this host's certificate"
        )
    stack = Stack.of(settings, lmcache_python_override=python)
    running = stack.coordinator.running_state(tidy=False)
    publication = (
        check_publication(
            settings, listen, tls_dir, target_port=running.port if running is not None else None
        )
        if listen is not None or not parsed
        else None
    )
    ensure = partial(
        stack.coordinator.ensure,
        chunk_size=chunk_size,
        hash_algorithm=hash_algorithm,
        ready_timeout_s=ready_timeout_s,
    )
    # One adopted from a server becomes a service only once its publication succeeded.
    state = ensure(runs_until_stop=running is None)
    edge_status: EdgeStatus | None = None
    try:
        if publication is not None:
            edge_status = publish(settings, publication, state.port, parsed)
        elif parsed and tls_dir is not None:
            routes = EdgeRoutes(outbound=[callback_route(node) for node in parsed])
            edge_status = edge.ensure_routes(settings, tls_dir, routes)
    except BaseException:
        if running is None:
            stack.coordinator.stop()
        raise
    if running is not None:
        state = ensure(runs_until_stop=True)
    view = _view(stack, state)
    return view.model_copy(
        update={
            "reused": running is not None,
            "edge_restarted": edge_status is not None and edge_status.restarted,
        }
    )


def coordinator_service_status(settings: Settings) -> CoordinatorServiceStatus:
    stack = Stack.of(settings)
    state = stack.coordinator.running_state()
    if state is None:
        return CoordinatorServiceStatus(
            running=False,
            data_dir=str(settings.data_dir),
            reason="no managed lmcache coordinator runs; start one with "
            "`graph-kvcache-mcp lmcache coordinator start`",
        )
    return _view(stack, state)


def stop_coordinator_service(settings: Settings, *, wait_s: float) -> CoordinatorServiceStop:
    """Stop the data dir's coordinator, then remove its routes from the edge (the one to it
    and its callbacks to nodes; the edge restarts with the rest, or stops when none is left)."""
    stack = Stack.of(settings)
    state = stack.coordinator.running_state(tidy=False)
    how = stack.coordinator.stop_how(term_wait_s=wait_s)
    result = CoordinatorServiceStop(
        stopped=how != "not_running",
        how=how,
        pid=None if state is None else state.process.pid,
        data_dir=str(settings.data_dir),
    )
    if state is None:
        return result
    to_coordinator = routes_to(state.port)

    def its_routes(route: Route) -> bool:
        return to_coordinator(route) or callback_node(route) is not None

    withdrawn = edge.withdraw_routes(settings, its_routes)
    return result.model_copy(update={"edge": withdrawn_note(withdrawn)})


def _view(stack: Stack, state: CoordinatorState) -> CoordinatorServiceStatus:
    reason = stack.coordinator.health(state)
    edge_status = edge.edge_status(stack.settings)
    routes = edge_status.routes.all() if edge_status.running and edge_status.routes else []
    where, join = published_join(edge_status, state.port, "coordinator_url")
    return CoordinatorServiceStatus(
        **running_fields(state.process, stack.settings.data_dir),
        reachable=reason is None,
        reason=reason,
        url=state.url,
        chunk_size=state.chunk_size,
        hash_algorithm=state.hash_algorithm,
        runs_until_stop=state.runs_until_stop,
        published=where,
        nodes=[str(node) for route in routes if (node := callback_node(route)) is not None],
        join=join,
    )
