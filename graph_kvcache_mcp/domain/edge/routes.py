"""What one host's edge carries: inbound and outbound routes, typed, and parsed from the CLI.

An *inbound* route listens on the host's address with TLS, requires a client certificate from
the fleet CA (unless it is a public API that checks its own key: `client_certificate="none"`)
and forwards to a service on loopback, or to a unix socket (vLLM's private KV event sockets).
An *outbound* route listens on loopback in the clear for a local child that cannot speak TLS
and carries its traffic to another host's edge with TLS, presenting this host's certificate
and checking the peer's against the CA and its name. `http` routes are HTTP-aware (connections
between the edges are pooled: the engine's client opens one connection per request); `tcp`
routes are raw tunnels (ZMQ feeds).

CLI forms (`parse_inbound`, `parse_outbound`):
    inbound   MODE:LISTEN_IP:PORT>[LOOPBACK_IP:]PORT          http:10.0.0.1:9443>9130
    outbound  MODE:[LOOPBACK_IP:]PORT>PEER_IP:PORT@PEER_NAME  http:19130>10.0.0.1:9443@store
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Annotated, ClassVar, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from graph_kvcache_mcp.domain.edge.pki import check_host_name
from graph_kvcache_mcp.errors import InvalidValue

RouteMode: TypeAlias = Literal["http", "tcp"]
ClientCertificate: TypeAlias = Literal["required", "none"]
"""Whether an inbound route's clients must present a fleet certificate. `none` is for an API
that authenticates its callers itself (vLLM's API key) and is read by clients that hold only the
CA; the TLS still hides the key and the prompts on the wire."""
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux
Port = Annotated[int, Field(ge=1, le=65535)]
MAX_ROUTES = 64
LOOPBACK = ipaddress.IPv4Address("127.0.0.1")

_INBOUND_FORM = "MODE:LISTEN_IP:PORT>[LOOPBACK_IP:]PORT, e.g. http:10.0.0.1:9443>9130"
_OUTBOUND_FORM = (
    "MODE:[LOOPBACK_IP:]PORT>PEER_IP:PORT@PEER_NAME, e.g. http:19130>10.0.0.1:9443@store"
)


class _Route(BaseModel):
    """What every route has: a mode and where it listens (named after both)."""

    model_config = ConfigDict(frozen=True)

    direction: ClassVar[str]
    mode: RouteMode
    listen_ip: ipaddress.IPv4Address
    listen_port: Port

    @property
    def name(self) -> str:
        """The route's haproxy section name: unique, since no two routes share a listener."""
        return f"{self.direction}_{self.mode}_{self.listen_ip}_{self.listen_port}".replace(".", "_")


class Inbound(_Route):
    """Listen on `listen` with TLS (mutual unless `client_certificate` is none); forward to a
    port on loopback or to a unix socket of this host."""

    direction = "in"
    target_ip: ipaddress.IPv4Address = LOOPBACK
    target_port: Port | None = None
    target_socket: Annotated[str, Field(min_length=2, max_length=MAX_SOCKET_PATH)] | None = None
    client_certificate: ClientCertificate = "required"

    @property
    def spec(self) -> str:
        """The route in its CLI form (what `--inbound` takes); a unix-socket target and a route
        without client certificates, which only a join plan makes, are named as such."""
        listen = f"{self.listen_ip}:{self.listen_port}"
        open_to_all = "" if self.client_certificate == "required" else " (no client certificate)"
        return f"{self.mode}:{listen}>{self.target}{open_to_all}"

    @model_validator(mode="after")
    def _target_is_local(self) -> Inbound:
        if not self.target_ip.is_loopback:
            raise ValueError(f"an inbound route forwards to loopback only, not {self.target_ip}")
        if self.listen_ip.is_unspecified:
            raise ValueError("an inbound route listens on one address, not 0.0.0.0")
        if (self.target_port is None) == (self.target_socket is None):
            raise ValueError("an inbound route forwards to a loopback port or a unix socket")
        if self.target_socket is not None and not self.target_socket.startswith("/"):
            raise ValueError(f"a unix socket target is an absolute path, not {self.target_socket}")
        return self

    @property
    def target(self) -> str:
        """Where the route forwards, as haproxy's server line names it."""
        if self.target_socket is not None:
            return f"unix@{self.target_socket}"
        return f"{self.target_ip}:{self.target_port}"


class Outbound(_Route):
    """Listen on loopback in the clear; carry to the peer's edge with mutual TLS."""

    direction = "out"
    listen_ip: ipaddress.IPv4Address = LOOPBACK
    peer_ip: ipaddress.IPv4Address
    peer_port: Port
    peer_name: Annotated[str, Field(min_length=1, max_length=63)]

    @property
    def spec(self) -> str:
        """The route in its CLI form (what `--outbound` takes)."""
        return (
            f"{self.mode}:{self.listen_ip}:{self.listen_port}>{self.peer_ip}:{self.peer_port}"
            f"@{self.peer_name}"
        )

    @model_validator(mode="after")
    def _listens_locally(self) -> Outbound:
        if not self.listen_ip.is_loopback:
            raise ValueError(
                f"an outbound route listens on loopback only (it is plain text), not "
                f"{self.listen_ip}"
            )
        check_host_name(self.peer_name)
        return self


class EdgeRoutes(BaseModel):
    """Every route of one host's edge; no two listen on the same address and port."""

    model_config = ConfigDict(frozen=True)

    inbound: list[Inbound] = Field(default_factory=list, max_length=MAX_ROUTES)
    outbound: list[Outbound] = Field(default_factory=list, max_length=MAX_ROUTES)

    @model_validator(mode="after")
    def _distinct_listeners(self) -> EdgeRoutes:
        if not self.inbound and not self.outbound:
            raise ValueError("an edge needs at least one --inbound or --outbound route")
        seen: set[tuple[str, int]] = set()
        for where in self.listeners():
            if where in seen:
                raise ValueError(f"two routes listen on {where[0]}:{where[1]}")
            seen.add(where)
        return self

    def listeners(self) -> list[tuple[str, int]]:
        """Every address and port the edge listens on."""
        inbound = [(str(r.listen_ip), r.listen_port) for r in self.inbound]
        return inbound + [(str(r.listen_ip), r.listen_port) for r in self.outbound]

    def all(self) -> list[Route]:
        return [*self.inbound, *self.outbound]

    def carries(self, other: EdgeRoutes) -> bool:
        """Whether every route of `other` is one of these (as given: same mode and ends)."""
        mine = set(self.all())
        return all(route in mine for route in other.all())

    def union(self, other: EdgeRoutes) -> EdgeRoutes:
        """These routes and `other`'s, each once.

        Raises:
            InvalidValue: a route of `other` listens where another route of these does; names
                both, since one edge cannot serve two routes on one listener.
        """
        held = {(str(r.listen_ip), r.listen_port): r for r in self.all()}
        added: list[Route] = []
        for route in other.all():
            where = (str(route.listen_ip), route.listen_port)
            current = held.get(where)
            if current is None:
                held[where] = route
                added.append(route)
            elif current != route:
                raise InvalidValue(
                    f"the edge already carries {current.spec} on {where[0]}:{where[1]}, so it "
                    f"cannot also carry {route.spec}: stop what that route serves (which "
                    "removes it) or choose another port"
                )
        return EdgeRoutes(
            inbound=[*self.inbound, *(r for r in added if isinstance(r, Inbound))],
            outbound=[*self.outbound, *(r for r in added if isinstance(r, Outbound))],
        )

    def without(self, unwanted: Callable[[Route], bool]) -> EdgeRoutes | None:
        """These routes less those `unwanted` picks; None when none is left (an edge needs
        one)."""
        inbound = [r for r in self.inbound if not unwanted(r)]
        outbound = [r for r in self.outbound if not unwanted(r)]
        return EdgeRoutes(inbound=inbound, outbound=outbound) if inbound or outbound else None


Route: TypeAlias = Inbound | Outbound


def parse_inbound(spec: str) -> Inbound:
    """An inbound route from its CLI form (see the module docstring).

    Raises:
        InvalidValue: names the part that is wrong and shows the form.
    """
    mode, rest = _mode(spec, _INBOUND_FORM)
    listen, _, target = rest.partition(">")
    listen_ip, listen_port = _address(listen, spec, _INBOUND_FORM, ip_required=True)
    target_ip, target_port = _address(target, spec, _INBOUND_FORM, ip_required=False)
    return _build(
        Inbound,
        spec,
        mode=mode,
        listen_ip=listen_ip,
        listen_port=listen_port,
        target_ip=target_ip or LOOPBACK,
        target_port=target_port,
    )


def parse_outbound(spec: str) -> Outbound:
    """An outbound route from its CLI form (see the module docstring).

    Raises:
        InvalidValue: names the part that is wrong and shows the form.
    """
    mode, rest = _mode(spec, _OUTBOUND_FORM)
    listen, _, remote = rest.partition(">")
    peer, at, peer_name = remote.partition("@")
    if not at:
        raise InvalidValue(
            f"outbound route {spec!r} names no peer (@NAME, the name in the peer's "
            f"certificate); the form is {_OUTBOUND_FORM}"
        )
    listen_ip, listen_port = _address(listen, spec, _OUTBOUND_FORM, ip_required=False)
    peer_ip, peer_port = _address(peer, spec, _OUTBOUND_FORM, ip_required=True)
    return _build(
        Outbound,
        spec,
        mode=mode,
        listen_ip=listen_ip or LOOPBACK,
        listen_port=listen_port,
        peer_ip=peer_ip,
        peer_port=peer_port,
        peer_name=check_host_name(peer_name),
    )


def routes_of(inbound: list[str], outbound: list[str]) -> EdgeRoutes:
    """The edge's routes from the CLI's `--inbound` and `--outbound` values.

    Raises:
        InvalidValue: a malformed route, none at all, or two on one listener.
    """
    parsed_in = [parse_inbound(spec) for spec in inbound]
    parsed_out = [parse_outbound(spec) for spec in outbound]
    try:
        return EdgeRoutes(inbound=parsed_in, outbound=parsed_out)
    except ValidationError as exc:
        raise InvalidValue(_first_error(exc)) from None


def _mode(spec: str, form: str) -> tuple[str, str]:
    mode, colon, rest = spec.partition(":")
    if not colon or mode not in ("http", "tcp"):
        raise InvalidValue(
            f"route {spec[:120]!r} must start with http: or tcp: (http for the engine, vLLM and "
            f"the coordinator, tcp for ZMQ feeds); the form is {form}"
        )
    return mode, rest


def _address(
    text: str, spec: str, form: str, *, ip_required: bool
) -> tuple[ipaddress.IPv4Address | None, int]:
    host, colon, port_text = text.rpartition(":")
    if not colon:
        host, port_text = "", text
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise InvalidValue(
            f"route {spec[:120]!r}: {text!r} needs a port 1-65535; the form is {form}"
        )
    if not host:
        if ip_required:
            raise InvalidValue(f"route {spec[:120]!r}: {text!r} needs an IP; the form is {form}")
        return None, int(port_text)
    try:
        return ipaddress.IPv4Address(host), int(port_text)
    except ValueError:
        raise InvalidValue(
            f"route {spec[:120]!r}: {host!r} is not an IPv4 address (the edge takes IPv4 "
            f"addresses for now); the form is {form}"
        ) from None


RouteT = TypeVar("RouteT", Inbound, Outbound)


def _build(model: type[RouteT], spec: str, **fields: object) -> RouteT:
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise InvalidValue(f"route {spec[:120]!r}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    message = str(exc.errors()[0].get("msg", exc))
    return message.removeprefix("Value error, ")
