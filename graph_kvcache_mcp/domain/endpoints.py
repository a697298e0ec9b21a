"""Parsing and policing the addresses we talk to. Pure: no I/O.

Plain `http://` is allowed only to loopback, so a bearer token never crosses a network in clear.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from graph_kvcache_mcp.errors import ConfigError

DEFAULT_KV_HOST = "127.0.0.1"
DEFAULT_KV_PORT = 9130
ENABLE_WORDS = frozenset({"1", "true", "yes", "on", "enable", "enabled"})


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and any address in 127.0.0.0/8 or ::1."""
    if host.lower() in {"localhost", "localhost."}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class HttpEndpoint:
    """A validated base URL, split into what a socket-level client needs."""

    scheme: str
    host: str
    port: int
    base_path: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)


def parse_http_url(url: str, *, what: str) -> HttpEndpoint:
    """Validate `url` as an http(s) base URL; `what` names the setting in error messages.

    Raises:
        ConfigError: the URL is malformed, not http(s), or plain http to a non-loopback host.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in {"http", "https"}:
        raise ConfigError(f"{what}: {url!r} must start with http:// or https://")
    if not parts.hostname:
        raise ConfigError(f"{what}: {url!r} has no host")
    if parts.username or parts.password:
        raise ConfigError(f"{what}: put credentials in the token setting, not in the URL")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what}: {url!r} must not carry a query or fragment")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"{what}: {url!r} has an invalid port") from exc
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise ConfigError(
            f"{what}: plain http:// to {parts.hostname} would send the token in clear; "
            "use https:// for any host other than loopback (127.0.0.1, localhost, ::1)"
        )
    return HttpEndpoint(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def url_from_addr(addr: str) -> str:
    """Turn an `EPISTEMIC_GRAPH_KVCACHE_ADDR` value into a base URL, as the engine reads it.

    A bare port means loopback, `host:port` is taken as is, and an enable word (`1`, `true`, ...)
    means the engine's default 127.0.0.1:9130.

    Raises:
        ConfigError: the value is none of those forms.
    """
    value = addr.strip()
    if value.lower() in ENABLE_WORDS:
        return f"http://{DEFAULT_KV_HOST}:{DEFAULT_KV_PORT}"
    if value.isdigit():
        return f"http://{DEFAULT_KV_HOST}:{_port(value, addr)}"
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"EPISTEMIC_GRAPH_KVCACHE_ADDR={addr!r}: use a port (9130), host:port "
            "(127.0.0.1:9130) or an enable word (1, true)"
        )
    return f"http://{host}:{_port(port, addr)}"


def _port(text: str, original: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise ConfigError(f"EPISTEMIC_GRAPH_KVCACHE_ADDR={original!r}: port must be 1-65535")
    return port
