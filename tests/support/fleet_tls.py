"""A fleet's TLS material for tests, made with the project's own PKI code: a CA, a store and a
node certificate, a second store certificate (for rotation), and a rogue CA's certificate."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509

from graph_kvcache_mcp.connectors.files import pki
from graph_kvcache_mcp.domain.edge.pki import HostRequest
from tests.support.engines import require_in_ci


@dataclass(frozen=True)
class FleetTls:
    """TLS dirs (ca.pem, cert.pem, key.pem) of one fleet, plus an outsider's."""

    store: Path
    store_next: Path
    node: Path
    rogue: Path


def make_fleet_tls(
    root: Path, store_address: str = "127.0.0.1", node_address: str = "127.0.0.1"
) -> FleetTls:
    now = datetime.now(UTC)
    pki.init_ca(root / "pki", now=now)
    pki.init_ca(root / "rogue-pki", now=now)
    dirs = {}
    for name, ca, host, address in (
        ("store", "pki", "store", store_address),
        ("store_next", "pki", "store", store_address),
        ("node", "pki", "node", node_address),
        ("rogue", "rogue-pki", "node", node_address),
    ):
        dirs[name] = root / name
        pki.issue(root / ca, HostRequest.of(host, [address]), dirs[name], now=now)
    return FleetTls(**dirs)


def require_haproxy() -> None:
    if shutil.which("haproxy") is None and shutil.which("haproxy", path="/usr/sbin") is None:
        require_in_ci("haproxy (apt-get install -y haproxy)")


def client_context(tls_dir: Path | None, ca_dir: Path) -> ssl.SSLContext:
    """A TLS client that trusts `ca_dir`'s CA and presents `tls_dir`'s certificate (none when
    None); the peer's name is not checked (the tests connect by address)."""
    context = ssl.create_default_context(cafile=str(ca_dir / "ca.pem"))
    context.check_hostname = False
    if tls_dir is not None:
        context.load_cert_chain(tls_dir / "cert.pem", tls_dir / "key.pem")
    return context


@contextmanager
def tls_connection(
    port: int, context: ssl.SSLContext, host: str = "127.0.0.1"
) -> Iterator[ssl.SSLSocket]:
    """A TLS connection to `host`:`port` with `context`."""
    with (
        socket.create_connection((host, port), timeout=5) as raw,
        context.wrap_socket(raw) as conn,
    ):
        yield conn


def http_exchange(conn: ssl.SSLSocket, path: str) -> bytes:
    """Send one keep-alive GET on `conn` and return the status line of its answer. The whole
    answer is read (its Content-Length body too), so the next exchange on `conn` starts at its
    own status line, however the bytes were split between reads."""
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: edge\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data.split(b"\r\n", 1)[0]
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")[1:]
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head.split(b"\r\n", 1)[0]


def refused(port: int, context: ssl.SSLContext, host: str = "127.0.0.1") -> str | None:
    """Why an HTTP request over TLS to `host`:`port` got no answer (None when it got one).
    With TLS 1.3 a refused client certificate shows on the first read, not in the handshake."""
    try:
        with tls_connection(port, context, host) as conn:
            status = http_exchange(conn, "/kv/stats")
    except (ssl.SSLError, ConnectionError) as exc:
        return type(exc).__name__ + ": " + str(exc)
    return None if status else "closed without an answer"


def served_serial(port: int, context: ssl.SSLContext) -> str:
    """The serial (hex) of the certificate a TLS listener on 127.0.0.1:`port` presents."""
    with tls_connection(port, context) as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return f"{x509.load_der_x509_certificate(der).serial_number:x}"


IMPOSTOR_BAIT = b"IMPOSTOR-SECRET-BAIT"


@contextmanager
def impostor(tls_dir: Path) -> Iterator[int]:
    """A TLS server on 127.0.0.1 presenting `tls_dir`'s certificate, accepting any client (or
    none), answering every request with `IMPOSTOR_BAIT`: what a client edge must never pass on.
    Yields its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_dir / "cert.pem", tls_dir / "key.pem")
    context.verify_mode = ssl.CERT_NONE
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            with contextlib.suppress(OSError), raw, context.wrap_socket(raw, server_side=True) as c:
                c.settimeout(5)
                c.recv(65536)
                c.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (len(IMPOSTOR_BAIT), IMPOSTOR_BAIT)
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
