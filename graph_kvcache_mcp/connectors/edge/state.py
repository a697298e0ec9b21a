"""What the managed edge records about itself, and what its verbs answer."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.processes.state_file import ProcessState
from graph_kvcache_mcp.connectors.processes.status import ProcessStatus, StopResult
from graph_kvcache_mcp.domain.edge.pki import HostCertificate
from graph_kvcache_mcp.domain.edge.routes import EdgeRoutes


class EdgeState(ProcessState):
    """The haproxy we started for this data dir: its routes and files."""

    routes: EdgeRoutes
    config_path: str
    stats_socket: str
    certificate_path: str
    tls_dir: str


class EdgeStatus(ProcessStatus):
    """The edge as `edge start` and `edge status` report it."""

    reachable: bool = Field(
        False,
        description="Every listener is held by the haproxy we started and its runtime API answers.",
    )
    routes: EdgeRoutes | None = None
    certificate: HostCertificate | None = Field(
        None, description="The host certificate the edge presents (from the last start/rotate)."
    )
    served_serial: str | None = Field(
        None, description="The serial haproxy itself reports serving (its runtime API)."
    )
    config_path: str | None = None
    restarted: bool = Field(
        False,
        description="This call restarted the edge to change its routes: every connection "
        "through it was dropped (clients reconnect).",
    )


class EdgeStopResult(StopResult):
    """What `edge stop` did."""


class EdgeRotateOut(BaseModel):
    """What `edge rotate` did: the certificate swapped in without a reload."""

    model_config = ConfigDict(frozen=True)

    rotated: bool
    previous_serial: str | None
    certificate: HostCertificate
    served_serial: str | None = Field(
        None, description="The serial haproxy reports serving after the swap."
    )
