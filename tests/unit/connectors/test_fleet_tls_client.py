"""A fleet file's tls_dir as a client (`connectors/net/tls_client`): the fleet CA trusted, this
host's certificate presented; another CA's certificate named as a certificate failure with the
CA that was trusted; a TLS dir the PKI's checks refuse (others may write it, a link) never used."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.net.tls_client import client_tls
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.targets import TlsIdentity
from graph_kvcache_mcp.errors import ConfigError
from tests.support.fleet_tls import FleetTls, make_fleet_tls


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@contextmanager
def mutual_tls_server(tls: FleetTls) -> Iterator[int]:
    """An HTTPS server on 127.0.0.1 with the store's certificate that requires a client
    certificate from the fleet CA (as every edge listener does). Yields its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.store / "cert.pem", tls.store / "key.pem")
    context.load_verify_locations(tls.store / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def _health(port: int, tls_dir: Path | None) -> bool | Unavailable:
    tls = None if tls_dir is None else client_tls(TlsIdentity(tls_dir))
    async with VllmClient(f"https://127.0.0.1:{port}/v1", tls=tls, timeout_s=10.0) as client:
        return await client.health()


def test_the_fleet_certificate_is_presented_and_another_cas_is_named(tmp_path: Path) -> None:
    tls = make_fleet_tls(tmp_path)
    with mutual_tls_server(tls) as port:
        assert anyio.run(_health, port, tls.node) is True
        rogue = anyio.run(_health, port, tls.rogue)
        plain = anyio.run(_health, port, None)
    assert isinstance(rogue, Unavailable)
    assert "certificate verify failed" in rogue.reason
    assert str(tls.rogue / "ca.pem") in rogue.reason  # the CA it trusted: the file's, not env
    assert isinstance(plain, Unavailable) and "certificate verify failed" in plain.reason


def test_a_tls_dir_others_can_change_is_refused_before_any_connection(tmp_path: Path) -> None:
    tls = make_fleet_tls(tmp_path)
    (tls.node / "cert.pem").chmod(0o646)
    with pytest.raises(ConfigError, match=r"cert\.pem"):
        client_tls(TlsIdentity(tls.node))
    (tls.node / "cert.pem").chmod(0o600)
    (tls.node / "key.pem").unlink()
    (tls.node / "key.pem").symlink_to(tls.rogue / "key.pem")
    with pytest.raises(ConfigError, match=r"key\.pem"):
        client_tls(TlsIdentity(tls.node))
