"""A node joins a store host (issue #37, item 4): `vllm start --engine-url https://S:PORT
--listen N:P --tls-dir DIR ...` starts this host's edge with every route the node needs at once
(`domain/edge/node_join.py` plans them), then the stack as `start_vllm` does, its children
pointed at the edge's loopback side: the store's engine (and coordinator) at
`http://127.0.0.1:PORT`, the store's token only in the environment of the child that sends it,
vLLM itself on loopback with its API key. The result adds the node's fleet entry.

The edge is no part of the stack: `vllm stop` leaves it running (the next start with the same
routes reuses it); `edge stop` stops it. A start that fails after it started the edge stops the
edge again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio.to_thread
from pydantic import Field, SecretStr

from graph_kvcache_mcp.config import Settings, token_from_file
from graph_kvcache_mcp.connectors.files.pki import load_tls_dir
from graph_kvcache_mcp.domain.edge.node_join import (
    DEFAULT_API_KEY_ENV,
    FleetEntry,
    NodeJoinPlan,
    NodeJoinRequest,
    plan_node_join,
)
from graph_kvcache_mcp.domain.edge.pki import HostCertificate
from graph_kvcache_mcp.domain.endpoints import approve_http_url
from graph_kvcache_mcp.domain.lmcache.stack import StackOptions
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.services import edge
from graph_kvcache_mcp.services.edge import EdgeStatus
from graph_kvcache_mcp.services.stack.lifetime import RunsUntilStop
from graph_kvcache_mcp.services.stack.stack import Stack
from graph_kvcache_mcp.services.stack.start import WaitProgress, start_vllm
from graph_kvcache_mcp.services.stack.views import VllmStatusOut

log = logging.getLogger(__name__)

API_KEY_VARIABLE = "VLLM_API_KEY"
"""The variable vLLM itself reads its key from, whatever the user's is called."""
EDGE_READY_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class NodeJoinFlags:
    """The `vllm start` flags that join a node to a store host (all optional)."""

    listen: str | None = None
    tls_dir: Path | None = None
    engine_url: str | None = None
    engine_token_file: Path | None = None
    store_name: str | None = None
    api_key_env: str | None = None
    """The variable holding vLLM's API key; None: `VLLM_API_KEY`."""

    def given(self, coordinator: str | None) -> bool:
        """Whether any of them (or a coordinator on another host) asks for a join."""
        named = (self.listen, self.tls_dir, self.engine_url, self.engine_token_file)
        return any(v is not None for v in (*named, self.store_name, self.api_key_env)) or (
            coordinator is not None and coordinator.startswith("https://")
        )


class NodeStartOut(VllmStatusOut):
    """`vllm start` of a node: vLLM's status, plus what the store and the operator need."""

    fleet_entry: FleetEntry | None = Field(
        None, description="Paste into a fleet file's instances as is (with --listen)."
    )
    coordinator_node: str | None = Field(
        None, description="NAME@N:P+3: the store's `lmcache coordinator start --node` value."
    )
    edge: EdgeStatus | None = Field(None, description="This host's edge, as the start left it.")


async def start_node(
    settings: Settings,
    launch: VllmLaunch,
    options: StackOptions,
    flags: NodeJoinFlags,
    *,
    lmcache_http_port: int | None,
    environ: Mapping[str, str],
    ready_timeout_s: float,
    progress: WaitProgress | None = None,
) -> NodeStartOut:
    """Start the node's edge, then its stack through it (see the module docstring).
    `lmcache_http_port`: the port the user asked for (a node's is P+3), None when not asked.

    Raises:
        InvalidValue: flags that miss or contradict each other (before anything starts).
        ConfigError: the TLS dir or the token file cannot be used.
        EdgeProcessError, EngineProcessError, LmcacheProcessError, VllmProcessError: as
            `edge.start_routes` and `start_vllm`.
    """
    certificate = _certificate(flags.tls_dir)
    key_variable = flags.api_key_env or DEFAULT_API_KEY_ENV
    api_key = environ.get(key_variable, "").strip()
    token = _token(flags.engine_token_file)
    stack = Stack.of(settings)
    plan = plan_node_join(
        NodeJoinRequest(
            listen=flags.listen,
            tls=certificate is not None,
            certificate_name=certificate.name if certificate else None,
            certificate_ips=tuple(certificate.addresses) if certificate else (),
            engine_url=flags.engine_url,
            engine_token=token is not None,
            coordinator=options.coordinator,
            store_name=flags.store_name,
            vllm_port=launch.port,
            lmcache_http_port=lmcache_http_port,
            kv_connector=launch.kv_connector,
            kv_events=launch.kv_events,
            event_sockets=stack.vllm_event_sockets() if launch.kv_events else None,
            api_key_env=key_variable,
            api_key_set=bool(api_key),
        )
    )
    node_settings = _children_settings(settings, plan, flags, token)
    node_options = _children_options(options, plan)
    edge_status = await _start_edge(settings, plan, flags.tls_dir)
    env = {API_KEY_VARIABLE: api_key} if api_key else {}
    try:
        out = await start_vllm(
            node_settings,
            launch,
            RunsUntilStop(),  # each piece runs until its own stop command
            options=node_options,
            ready_timeout_s=ready_timeout_s,
            progress=progress,
            calls_base_url=settings.vllm_base_url,
            env=env,
        )
    except BaseException:
        if edge_status is not None and not edge_status.reused:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: edge.stop(settings, wait_s=10.0))
            log.warning("the node's start failed: stopped the edge it started")
        raise
    return NodeStartOut(
        **out.model_dump(),
        fleet_entry=plan.fleet_entry,
        coordinator_node=plan.coordinator_node,
        edge=edge_status,
    )


def _certificate(tls_dir: Path | None) -> HostCertificate | None:
    """The node's certificate (its name and addresses), the TLS dir checked as the edge will."""
    if tls_dir is None:
        return None
    return load_tls_dir(tls_dir, now=datetime.now(UTC)).summary


def _token(path: Path | None) -> SecretStr | None:
    """The store's engine token: from a regular file of ours that no one else can read."""
    return None if path is None else token_from_file(str(path), "--engine-token-file")


def _children_settings(
    settings: Settings, plan: NodeJoinPlan, flags: NodeJoinFlags, token: SecretStr | None
) -> Settings:
    """The settings the stack starts under: the store's engine as the children reach it."""
    update: dict[str, object] = {}
    if plan.engine is not None:
        update["kv_url"] = plan.engine.local_url
    elif flags.engine_url is not None:  # reached as it is: the URL policy decides
        hosts = settings.insecure_http_hosts
        update["kv_url"] = approve_http_url(
            flags.engine_url, what="--engine-url", insecure_hosts=hosts
        ).url.rstrip("/")
    if token is not None:
        update["kv_token"] = token
    return settings.model_copy(update=update) if update else settings


def _children_options(options: StackOptions, plan: NodeJoinPlan) -> StackOptions:
    """The lmcache server's choices: the coordinator at the edge's loopback side, called back
    at the node's advertised address and admin port P+3."""
    update: dict[str, object] = {}
    if plan.coordinator is not None:
        update["coordinator"] = plan.coordinator.local_url
        update["coordinator_advertise_ip"] = plan.advertise_ip
    if plan.lmcache_http_port is not None:
        update["http_port"] = plan.lmcache_http_port
    return options.model_copy(update=update) if update else options


async def _start_edge(
    settings: Settings, plan: NodeJoinPlan, tls_dir: Path | None
) -> EdgeStatus | None:
    if plan.routes is None or tls_dir is None:
        return None
    routes = plan.routes

    def start() -> EdgeStatus:
        return edge.start_routes(
            settings, routes, tls_dir=tls_dir, ready_timeout_s=EDGE_READY_TIMEOUT_S
        )

    return await anyio.to_thread.run_sync(start)
