"""The haproxy configuration of one host's edge, rendered from its routes (pure).

Choices, measured (docs/multi-host.md):
- `http` routes run haproxy's HTTP mode with `http-reuse always`: the engine's client sends
  `Connection: close`, so a raw tunnel would pay a TLS handshake between the edges on every
  request (3-8x slower); HTTP mode keeps a pool of TLS connections between the edges.
- Every TLS server line carries `ca-file` + `verify required` + `verifyhost`: the peer must hold a
  certificate from the fleet CA issued to the expected name. Every TLS bind carries `ca-file` +
  `verify required`: a client without a fleet certificate fails in the handshake; the one
  exception is an inbound route marked `client_certificate="none"` (a node's vLLM API, which
  checks its own key): `verify none`, TLS for privacy only.
- `timeout tunnel` is long: a quiet ZMQ feed is idle for minutes (readers also send ZMQ
  heartbeats well inside it).
- Certificates are swapped through the runtime API on a private stats socket, never by a reload
  (a reload with a live TCP-mode TLS connection crashed Debian haproxy 2.6's old worker).
"""

from __future__ import annotations

import re
from pathlib import PurePath

from pydantic import BaseModel, ConfigDict

from graph_kvcache_mcp.domain.edge.routes import EdgeRoutes, Inbound, Outbound
from graph_kvcache_mcp.errors import ConfigError

CONNECT_TIMEOUT = "5s"
CLIENT_TIMEOUT = "60s"
SERVER_TIMEOUT = "60s"
TUNNEL_TIMEOUT = "1h"
"""Idle limit of an established TCP-mode or upgraded connection (a quiet feed)."""
KEEP_ALIVE_TIMEOUT = "120s"
"""How long a pooled connection between the edges may idle before it is closed."""
HTTP_REQUEST_TIMEOUT = "10s"
"""A client that sends its request headers slower than this is cut (slow-loris)."""

# haproxy reads double-quoted words with backslash escapes and `$VAR` expansion; a path we put
# in the configuration keeps to characters that need none of it.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+@=,:-]+$")


class EdgeFiles(BaseModel):
    """Where the edge's running haproxy finds its certificate, CA and runtime socket."""

    model_config = ConfigDict(frozen=True)

    certificate: PurePath
    """This host's certificate and key, one PEM file (haproxy's `crt`)."""
    ca: PurePath
    stats_socket: PurePath


def render(routes: EdgeRoutes, files: EdgeFiles) -> str:
    """The whole haproxy configuration for `routes`.

    Raises:
        ConfigError: a path holds characters haproxy's configuration would interpret.
    """
    crt, ca, stats = (_path(p) for p in (files.certificate, files.ca, files.stats_socket))
    lines = [
        "# written by graph-kvcache-mcp edge start; edits are lost on the next start",
        "global",
        "  nbthread 1",
        f"  stats socket {stats} mode 600 level admin",
        "  ssl-default-bind-options ssl-min-ver TLSv1.2",
        "  ssl-default-server-options ssl-min-ver TLSv1.2",
        "defaults",
        f"  timeout connect {CONNECT_TIMEOUT}",
        f"  timeout client {CLIENT_TIMEOUT}",
        f"  timeout server {SERVER_TIMEOUT}",
        f"  timeout tunnel {TUNNEL_TIMEOUT}",
        f"  timeout http-keep-alive {KEEP_ALIVE_TIMEOUT}",
        f"  timeout http-request {HTTP_REQUEST_TIMEOUT}",
    ]
    for inbound in routes.inbound:
        lines += _inbound(inbound, crt, ca)
    for outbound in routes.outbound:
        lines += _outbound(outbound, crt, ca)
    return "\n".join(lines) + "\n"


def _inbound(route: Inbound, crt: str, ca: str) -> list[str]:
    required = route.client_certificate == "required"
    verify = f"ca-file {ca} verify required" if required else "verify none"
    target = route.target
    if route.target_socket is not None:
        target = f"unix@{_path(PurePath(route.target_socket))}"
    return [
        f"listen {route.name}",
        f"  mode {route.mode}",
        *(["  http-reuse always"] if route.mode == "http" else []),
        f"  bind {route.listen_ip}:{route.listen_port} ssl crt {crt} {verify}",
        f"  server local {target}",
    ]


def _outbound(route: Outbound, crt: str, ca: str) -> list[str]:
    name = route.peer_name
    return [
        f"listen {route.name}",
        f"  mode {route.mode}",
        *(["  http-reuse always"] if route.mode == "http" else []),
        f"  bind {route.listen_ip}:{route.listen_port}",
        f"  server peer {route.peer_ip}:{route.peer_port} ssl crt {crt} ca-file {ca} "
        f"verify required verifyhost {name} sni str({name})",
    ]


def _path(path: PurePath) -> str:
    text = str(path)
    if not _SAFE_PATH.match(text):
        raise ConfigError(
            f"the edge cannot use {text[:200]!r}: haproxy's configuration would interpret some "
            "of its characters; choose a --data-dir whose path has only letters, digits and "
            "._/+@=,:-"
        )
    return text
