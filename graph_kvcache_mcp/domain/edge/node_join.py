"""A node joining a store host (issue #37, item 4): the routes its edge carries, the loopback
URLs its children get instead of the store's https ones, the address it advertises to the
coordinator, and the fleet entry it prints. Pure: the caller reads the files and the environment
and passes what they said.

Ports, from `--listen N:P` (docs/multi-host.md, "A node joins"):
    P     vLLM's OpenAI API: TLS, no client certificate (clients hold only the CA; vLLM checks
          its API key)
    P+1   the KV-event live feed (ZMQ PUB, a unix socket in vLLM's private dir): mutual TLS
    P+2   the KV-event replay (ZMQ ROUTER, likewise): mutual TLS
    P+3   the lmcache server's admin HTTP (the coordinator's callbacks, the operator's tier
          reads): mutual TLS; the server listens on 127.0.0.1:P+3 behind it
The store's engine and coordinator reach the children on loopback at the port number the store's
edge listens on (`http://127.0.0.1:9443` for `https://S:9443`): their TLS is the edge's, which
checks the store's certificate for `--store-name`.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from graph_kvcache_mcp.domain.edge.routes import LOOPBACK, EdgeRoutes, Inbound, Outbound
from graph_kvcache_mcp.domain.edge.store import advertised_loopback
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.vllm.launch import MP_CONNECTORS, KvConnector
from graph_kvcache_mcp.errors import ConfigError, InvalidValue

NODE_PORTS = 4
"""P..P+3: the API, the live feed, the replay, the lmcache server's admin HTTP."""
DEFAULT_API_KEY_ENV = "VLLM_API_KEY"
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
STORE_CONNECTORS: frozenset[str] = frozenset({"engine", "mp_native"})
"""The connectors whose children can reach a store's engine through the edge (`redis_resp`
speaks to the managed engine's RESP wire, which no edge carries)."""


class NodeJoinRequest(BaseModel):
    """What `vllm start` was asked for, and the facts the caller read (certificate, variable)."""

    model_config = ConfigDict(frozen=True)

    listen: str | None = Field(None, description="N:P, the node's address and first port.")
    tls: bool = Field(False, description="--tls-dir was given (and its certificate read).")
    certificate_name: str | None = None
    certificate_ips: tuple[str, ...] = ()
    engine_url: str | None = None
    engine_token: bool = Field(False, description="--engine-token-file was given.")
    coordinator: str | None = None
    store_name: str | None = None
    vllm_port: int
    lmcache_http_port: int | None = Field(None, description="--lmcache-http-port, if given.")
    kv_connector: KvConnector = "none"
    kv_events: bool = False
    event_sockets: tuple[str, str] | None = Field(
        None, description="The unix sockets vLLM binds for its KV events: the feed, the replay."
    )
    api_key_env: str = DEFAULT_API_KEY_ENV
    api_key_set: bool = False


class FleetEntry(BaseModel):
    """A node's entry for a fleet file's `instances`, pasted as is (the operator's host reads
    every https URL with its fleet certificate, the `tls://` feeds through its own edge)."""

    model_config = ConfigDict(frozen=True)

    name: str
    tls_name: str
    base_url: str
    api_key_env: str
    kv_events: str | None = None
    kv_events_replay: str | None = None
    lmcache_http_url: str | None = None

    @model_serializer(mode="wrap")
    def _only_what_applies(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # pasted as is: a field that does not apply is left out, not written as null
        return {k: v for k, v in handler(self).items() if v is not None}


class StoreHop(BaseModel):
    """One https URL of the store, reached by the children at a loopback URL of the edge."""

    model_config = ConfigDict(frozen=True)

    route: Outbound

    @property
    def local_url(self) -> str:
        return f"http://{self.route.listen_ip}:{self.route.listen_port}"


class NodeJoinPlan(BaseModel):
    """The edge's routes and what the stack's children are given instead of the store's URLs."""

    model_config = ConfigDict(frozen=True)

    routes: EdgeRoutes | None = Field(None, description="None: nothing to route (no edge).")
    engine: StoreHop | None = None
    coordinator: StoreHop | None = None
    advertise_ip: str | None = Field(
        None, description="What the lmcache server advertises to the coordinator (127.X.Y.Z)."
    )
    lmcache_http_port: int | None = Field(None, description="P+3, on loopback behind the edge.")
    fleet_entry: FleetEntry | None = None
    coordinator_node: str | None = Field(
        None, description="NAME@N:P+3, the store's `lmcache coordinator start --node` value."
    )


def plan_node_join(request: NodeJoinRequest) -> NodeJoinPlan:
    """The node's routes, loopback URLs, advertised address and fleet entry.

    Raises:
        InvalidValue: a flag missing or contradicting another; the message names the fix.
    """
    listen = _listen(request)
    engine = _store_hop(request, request.engine_url, "--engine-url")
    coordinator = _coordinator_hop(request, listen)
    _check_engine_use(request)
    inbound = _inbound_routes(request, listen) if listen is not None else []
    outbound = [hop.route for hop in (engine, coordinator) if hop is not None]
    if len({(r.listen_ip, r.listen_port) for r in outbound}) < len(outbound):
        raise InvalidValue(
            "--engine-url and --coordinator name the same port of the store; the store's edge "
            "listens on one port for each"
        )
    _refuse_local_collisions(request, listen, outbound)
    routes = EdgeRoutes(inbound=inbound, outbound=outbound) if inbound or outbound else None
    if listen is None:
        return NodeJoinPlan(routes=routes, engine=engine)
    ip, port = listen
    name = request.certificate_name or ""
    admin = port + 3 if request.kv_connector in MP_CONNECTORS else None
    if admin is not None and request.lmcache_http_port not in (None, admin):
        raise InvalidValue(
            f"--lmcache-http-port {request.lmcache_http_port}: a node's lmcache server answers "
            f"on P+3 ({admin}) on loopback, behind its edge; drop the flag"
        )
    entry = FleetEntry(
        name=name,
        tls_name=name,
        base_url=f"https://{ip}:{port}/v1",
        api_key_env=request.api_key_env,
        kv_events=f"tls://{ip}:{port + 1}" if request.kv_events else None,
        kv_events_replay=f"tls://{ip}:{port + 2}" if request.kv_events else None,
        lmcache_http_url=f"https://{ip}:{admin}" if admin is not None else None,
    )
    return NodeJoinPlan(
        routes=routes,
        engine=engine,
        coordinator=coordinator,
        advertise_ip=str(advertised_loopback(ip)) if coordinator is not None else None,
        lmcache_http_port=admin,
        fleet_entry=entry,
        coordinator_node=f"{name}@{ip}:{admin}" if coordinator is not None else None,
    )


def _listen(request: NodeJoinRequest) -> tuple[ipaddress.IPv4Address, int] | None:
    if request.listen is None:
        return None
    if not request.tls:
        raise InvalidValue(
            "--listen publishes vLLM on the host's address through the edge, which needs this "
            "host's certificate: add --tls-dir DIR (from `fleet pki issue --name NODE --ip N`)"
        )
    host, colon, port_text = request.listen.rpartition(":")
    try:
        ip = ipaddress.IPv4Address(host)
    except ValueError:
        ip = None
    if not colon or ip is None or not port_text.isdigit():
        raise InvalidValue(
            f"--listen {request.listen!r}: give the node's IPv4 address and the first of four "
            "ports, e.g. --listen 10.0.0.2:8443"
        )
    port = int(port_text)
    if not 1 <= port <= 65535 - (NODE_PORTS - 1):
        raise InvalidValue(
            f"--listen {request.listen!r}: the port must be 1-{65535 - NODE_PORTS + 1} (the "
            f"node uses it and the next {NODE_PORTS - 1})"
        )
    if ip.is_loopback or ip.is_unspecified:
        raise InvalidValue(
            f"--listen {request.listen!r}: the edge listens on the host's own address, one that "
            "other hosts reach (not loopback or 0.0.0.0)"
        )
    if str(ip) not in request.certificate_ips:
        listed = ", ".join(request.certificate_ips) or "none"
        raise InvalidValue(
            f"--listen {ip} is not an address of the node's certificate (its addresses: "
            f"{listed}); issue one that names it: `fleet pki issue --name "
            f"{request.certificate_name or 'NODE'} --ip {ip} --out DIR`"
        )
    if not _VARIABLE_NAME.match(request.api_key_env):
        raise InvalidValue(
            f"--api-key-env {request.api_key_env[:130]!r} is not an environment variable name "
            "(letters, digits and _, not starting with a digit)"
        )
    if not request.api_key_set:
        raise InvalidValue(
            f"--listen publishes vLLM's API, which must never be open without a key: set "
            f"{request.api_key_env} (or name the variable holding the key with --api-key-env)"
        )
    return ip, port


def _store_hop(request: NodeJoinRequest, url: str | None, flag: str) -> StoreHop | None:
    """An outbound route for an https URL of the store (None for none, or for a URL the
    children reach as it is)."""
    if url is None:
        return None
    try:
        endpoint = parse_http_url(url, what=flag)
    except ConfigError as exc:
        raise InvalidValue(str(exc)) from None
    if endpoint.scheme != "https":
        return None
    why = {
        "--tls-dir": "--tls-dir DIR (this node's, from `fleet pki issue`)",
        "--store-name": "--store-name NAME (the store certificate's DNS name, tls_name in its "
        "join output)",
    }
    missing = [
        why[f]
        for f, given in (("--tls-dir", request.tls), ("--store-name", request.store_name))
        if not given
    ]
    if missing:
        raise InvalidValue(
            f"{flag} {url} is reached through this host's edge with mutual TLS, which needs "
            f"{' and '.join(missing)}"
        )
    if endpoint.base_path.strip("/"):
        raise InvalidValue(f"{flag} {url}: give the store's edge as https://IP:PORT, no path")
    try:
        peer = ipaddress.IPv4Address(endpoint.host)
    except ValueError:
        raise InvalidValue(
            f"{flag} {url}: the edge reaches the store by its IPv4 address; give "
            "https://IP:PORT (the store's `--json` join output prints it)"
        ) from None
    route = Outbound(
        mode="http",
        listen_ip=LOOPBACK,
        listen_port=endpoint.port,
        peer_ip=peer,
        peer_port=endpoint.port,
        peer_name=request.store_name or "",
    )
    return StoreHop(route=route)


def _coordinator_hop(
    request: NodeJoinRequest, listen: tuple[ipaddress.IPv4Address, int] | None
) -> StoreHop | None:
    hop = _store_hop(request, request.coordinator, "--coordinator")
    if hop is None:
        return None
    if request.kv_connector != "mp_native":
        raise InvalidValue(
            "--coordinator joins the lmcache server of an MP stack: use --kv-connector mp_native"
        )
    if listen is None:
        raise InvalidValue(
            "--coordinator https://... calls this node's lmcache server back through the edge: "
            "add --listen N:P (the server's admin port is P+3)"
        )
    return hop


def _refuse_local_collisions(
    request: NodeJoinRequest,
    listen: tuple[ipaddress.IPv4Address, int] | None,
    outbound: list[Outbound],
) -> None:
    """The edge's loopback side of a store URL keeps the store's port number: refuse one that
    vLLM or the lmcache server's admin HTTP (P+3) would need on loopback too."""
    local = {request.vllm_port: "vLLM's --port"}
    if listen is not None and request.kv_connector in MP_CONNECTORS:
        local[listen[1] + 3] = "the lmcache server's admin port P+3"
    for route in outbound:
        if (taken := local.get(route.listen_port)) is not None:
            raise InvalidValue(
                f"the store's port {route.listen_port} is also {taken} on this host's loopback, "
                "where the edge gives the children the store at the same port number: choose "
                "another --port (or --listen port)"
            )


def _check_engine_use(request: NodeJoinRequest) -> None:
    if request.engine_token and request.engine_url is None:
        raise InvalidValue(
            "--engine-token-file is the token of the store's engine: give --engine-url too"
        )
    if request.engine_url is not None and request.kv_connector not in STORE_CONNECTORS:
        raise InvalidValue(
            f"--engine-url is the KV tier of vLLM's children, and --kv-connector "
            f"{request.kv_connector} uses none through it: use --kv-connector engine or mp_native"
        )


def _inbound_routes(
    request: NodeJoinRequest, listen: tuple[ipaddress.IPv4Address, int]
) -> list[Inbound]:
    ip, port = listen
    routes = [
        Inbound(
            mode="http",
            listen_ip=ip,
            listen_port=port,
            target_port=request.vllm_port,
            client_certificate="none",
        )
    ]
    if request.kv_events:
        if request.event_sockets is None:
            raise InvalidValue("kv_events needs the sockets vLLM binds (the lifecycle names them)")
        routes += [
            Inbound(mode="tcp", listen_ip=ip, listen_port=port + offset, target_socket=socket)
            for offset, socket in enumerate(request.event_sockets, start=1)
        ]
    if request.kv_connector in MP_CONNECTORS:
        routes.append(
            Inbound(mode="http", listen_ip=ip, listen_port=port + 3, target_port=port + 3)
        )
    return routes
