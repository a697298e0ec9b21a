"""The store host (issue #37): the managed engine published on this host's edge, and what a
node needs to join it. LMCache's coordinator is published the same way
(`services/stack/coordinator_service.py`), through the helpers here.

A published service stays on loopback; the edge's inbound `http` route (mutual TLS, a fleet
client certificate required) is the only listener on the host's address. Everything a flag
names is checked before anything starts: the address must be one of the certificate's IP SANs
(peers would reject the edge otherwise) and free to bind, or already the edge's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.state import Backend, EngineStatus, EngineStopResult
from graph_kvcache_mcp.connectors.files.pki import load_tls_dir
from graph_kvcache_mcp.connectors.processes.ports import bind_refusal
from graph_kvcache_mcp.domain.edge.routes import Inbound, Route
from graph_kvcache_mcp.domain.edge.store import (
    Address,
    Node,
    check_in_certificate,
    parse_listen,
    published_routes,
)
from graph_kvcache_mcp.errors import InvalidValue
from graph_kvcache_mcp.services import edge
from graph_kvcache_mcp.services.edge import EdgeStatus
from graph_kvcache_mcp.services.stack.lifetime import Note
from graph_kvcache_mcp.services.stack.stack import Stack


class StoreJoin(BaseModel):
    """What a node needs to join this store host (only the fields that apply are printed)."""

    model_config = ConfigDict(frozen=True)

    engine_url: str | None = Field(None, description="The engine's `/kv` on the store's edge.")
    coordinator_url: str | None = Field(
        None, description="LMCache's coordinator on the store's edge."
    )
    tls_name: str = Field(description="The store certificate's DNS name (a node's --store-name).")
    ca_sha256: str = Field(description="SHA-256 of the fleet CA's certificate, hex: compare it.")
    token_file: str | None = Field(
        None,
        description="The engine token's file on the store host: copy it to nodes privately.",
    )

    @model_serializer(mode="wrap")
    def _applying(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


class PublishedEngineStatus(EngineStatus):
    """`engine start|status` of an engine published on this host's edge."""

    published: str | None = Field(
        None, description="host:port where the edge serves the engine (mutual TLS)."
    )
    edge_restarted: bool = Field(
        False,
        description="This start restarted the edge to add the engine's route: connections "
        "through the edge were dropped.",
    )
    join: StoreJoin | None = None


class EngineStopOut(EngineStopResult):
    """`engine stop`, and what became of the engine's route on the edge."""

    edge: str | None = Field(
        None, description="What happened to the edge (its route to the engine removed)."
    )


@dataclass(frozen=True)
class Publication:
    """Where a service is to be published, checked: the host address and the TLS dir whose
    certificate names it."""

    listen: Address
    tls_dir: Path


def check_publication(
    settings: Settings, listen: str | None, tls_dir: Path | None, *, target_port: int | None
) -> Publication | None:
    """The checked publication of `--listen` with `--tls-dir` (None when neither is given).
    `target_port`: the loopback port the service holds now (None when not running): a route of
    the edge there already is no clash.

    Raises:
        InvalidValue: one flag without the other (naming the missing one), a malformed address,
            one the certificate does not name, or a port taken.
        ConfigError: the TLS dir cannot be used.
    """
    if listen is None and tls_dir is None:
        return None
    if listen is None or tls_dir is None:
        missing, given = ("--tls-dir", "--listen") if tls_dir is None else ("--listen", "--tls-dir")
        raise InvalidValue(
            f"{given} needs {missing}: publishing a service takes both the host address "
            "(--listen IP:PORT) and the host's TLS dir (--tls-dir, from `fleet pki issue`)"
        )
    address = parse_listen(listen)
    certificate = load_tls_dir(tls_dir, now=datetime.now(UTC)).summary
    check_in_certificate(address, certificate.addresses)
    _check_free(settings, address, target_port)
    return Publication(address, tls_dir)


def publish(
    settings: Settings, publication: Publication, target_port: int, nodes: list[Node]
) -> EdgeStatus:
    """The service on loopback `target_port` published on the edge (with `nodes`' callback
    routes), through `edge.ensure_routes`."""
    routes = published_routes(publication.listen, target_port, nodes)
    return edge.ensure_routes(settings, publication.tls_dir, routes)


def published_at(status: EdgeStatus, target_port: int) -> str | None:
    """Where the edge serves the loopback port `target_port`, if it does."""
    for route in status.routes.inbound if status.routes is not None else []:
        if route.target_port == target_port and route.target_ip.is_loopback:
            return f"{route.listen_ip}:{route.listen_port}"
    return None


def published_join(
    status: EdgeStatus, target_port: int, url_field: str, **extra: str
) -> tuple[str | None, StoreJoin | None]:
    """Where the edge serves loopback `target_port`, and the join object naming it as
    `url_field` (with `extra`); (None, None) when the edge does not serve it."""
    where = published_at(status, target_port) if status.running else None
    if where is None or status.certificate is None:
        return None, None
    join = StoreJoin.model_validate(
        {
            url_field: f"https://{where}",
            "tls_name": status.certificate.name,
            "ca_sha256": status.certificate.ca_fingerprint_sha256,
            **extra,
        }
    )
    return where, join


def routes_to(target_port: int) -> Callable[[Route], bool]:
    """Picks the inbound routes that forward to loopback `target_port`."""
    return lambda route: isinstance(route, Inbound) and route.target_port == target_port


def start_published_engine(
    settings: Settings,
    *,
    listen: str | None,
    tls_dir: Path | None,
    port: int | None,
    backend: Backend | None,
    ready_timeout_s: float,
    progress: Note | None = None,
    resp: bool = False,
) -> PublishedEngineStatus:
    """`engine start`, published on the edge when `listen` and `tls_dir` are given: the flags
    checked first, then the engine started (or reused), then its route added to the edge. A
    failed publication stops the engine again when this call started it.

    Raises:
        InvalidValue, ConfigError: see `check_publication`.
        EngineProcessError: the engine did not start.
        EdgeProcessError: the edge did not come up.
    """
    stack = Stack.of(settings)
    running = stack.engine.running_state(tidy=False)
    publication = check_publication(
        settings, listen, tls_dir, target_port=running.port if running is not None else None
    )
    status = stack.start_engine(
        port=port,
        backend=backend,
        ready_timeout_s=ready_timeout_s,
        progress=progress,
        resp=resp,
    )
    if publication is None or status.port is None:
        return _engine_view(stack, status, edge.edge_status(settings))
    try:
        edge_status = publish(settings, publication, status.port, [])
    except BaseException:
        if not status.reused:
            stack.stop_engine(wait_s=10.0, force=True)
        raise
    return _engine_view(stack, status, edge_status).model_copy(
        update={"edge_restarted": edge_status.restarted}
    )


def published_engine_status(settings: Settings) -> PublishedEngineStatus:
    """`engine status`, with where the edge publishes the engine when it does."""
    stack = Stack.of(settings)
    return _engine_view(stack, stack.engine_status(), edge.edge_status(settings))


def stop_published_engine(settings: Settings, *, wait_s: float) -> EngineStopOut:
    """`engine stop`; the edge's route to the engine is removed (the edge restarts with its
    other routes, or stops when it had none): a route left to a free loopback port would hand
    the nodes' requests, token and all, to whatever binds that port next.

    Raises:
        EngineProcessError: see `Stack.stop_engine`.
    """
    stack = Stack.of(settings)
    state = stack.engine.running_state(tidy=False)
    result = stack.stop_engine(wait_s=wait_s)
    out = EngineStopOut(**result.model_dump())
    if state is None:
        return out
    return out.model_copy(update={"edge": unpublish(settings, state.port)})


def unpublish(settings: Settings, target_port: int) -> str | None:
    """Remove the edge's routes to loopback `target_port` (a service just stopped there): what
    became of the edge, in a line; None when it had no such route.

    Raises:
        EdgeProcessError: the edge, restarted with its other routes, did not come up.
    """
    return withdrawn_note(edge.withdraw_routes(settings, routes_to(target_port)))


def withdrawn_note(status: EdgeStatus | None) -> str | None:
    """What `edge.withdraw_routes` did, in a line (None when it did nothing)."""
    if status is None:
        return None
    if not status.running:
        return "edge stopped: it carried no other route"
    return "edge restarted without the route (connections through it were dropped)"


def _engine_view(
    stack: Stack, status: EngineStatus, edge_status: EdgeStatus
) -> PublishedEngineStatus:
    view = PublishedEngineStatus(**status.model_dump())
    if not status.running or status.port is None:
        return view
    where, join = published_join(
        edge_status,
        status.port,
        "engine_url",
        token_file=str(stack.engine.token_path),
    )
    return view.model_copy(update={"published": where, "join": join})


def _check_free(settings: Settings, listen: Address, target_port: int | None) -> None:
    current = edge.edge_status(settings)
    for route in current.routes.inbound if current.running and current.routes else []:
        if (route.listen_ip, route.listen_port) != listen:
            continue
        if target_port is not None and route.target_port == target_port:
            return  # already published there: the edge's route is this one
        raise InvalidValue(
            f"--listen {listen}: the edge already carries {route.spec} there; stop the service "
            "it publishes, or choose another port"
        )
    if (refusal := bind_refusal(str(listen.ip), listen.port)) is not None:
        raise InvalidValue(f"--listen {listen}: {refusal}; choose a free port on this host")
