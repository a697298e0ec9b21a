"""Parsing and policing the addresses we talk to. Pure: no I/O.

Plain `http://` is allowed to loopback, and to hosts the user lists in
`GRAPH_KVCACHE_INSECURE_HTTP_HOSTS` (names or CIDRs); anything else must be `https://`, so a
token never crosses a network in clear unless the user said that network is trusted. An
unauthenticated KV-event feed (ZMQ) is another risk with its own list,
`GRAPH_KVCACHE_INSECURE_FEED_HOSTS`: trusting a host with tokens in clear does not mean trusting
whatever answers on its feed ports, nor the other way round.

`approve_http_url` applies that policy where a URL enters (settings, tool arguments); connectors
that receive an approved URL only `parse_http_url` it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from graph_kvcache_mcp.errors import ConfigError, quoted, shortened

DEFAULT_KV_HOST = "127.0.0.1"
DEFAULT_KV_PORT = 9130
ENABLE_WORDS = frozenset({"1", "true", "yes", "on", "enable", "enabled"})
INSECURE_HOSTS_ENV = "GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"
FEED_HOSTS_ENV = "GRAPH_KVCACHE_INSECURE_FEED_HOSTS"
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


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
    """Split `url` as an http(s) base URL; `what` names the setting in error messages.

    Shape only: whether plain http may go to this host is `approve_http_url`'s question.

    Raises:
        ConfigError: the URL is malformed, not http(s), or carries credentials, query or fragment.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in {"http", "https"}:
        raise ConfigError(f"{what}: {quoted(url)} must start with http:// or https://")
    if not parts.hostname:
        raise ConfigError(f"{what}: {quoted(url)} has no host")
    if parts.username or parts.password:
        raise ConfigError(f"{what}: put credentials in the token setting, not in the URL")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what}: {quoted(url)} must not carry a query or fragment")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"{what}: {quoted(url)} has an invalid port") from exc
    return HttpEndpoint(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def approve_http_url(url: str, *, what: str, insecure_hosts: Sequence[str] = ()) -> HttpEndpoint:
    """`parse_http_url`, then refuse plain http to a host that is neither loopback nor listed in
    `insecure_hosts` (entries as `check_insecure_hosts` returns them).

    Raises:
        ConfigError: malformed, or plain http to an unlisted host; the message names
            GRAPH_KVCACHE_INSECURE_HTTP_HOSTS and the https alternative.
    """
    endpoint = parse_http_url(url, what=what)
    if endpoint.scheme == "http" and not plain_http_allowed(endpoint.host, insecure_hosts):
        host = shortened(endpoint.host)
        raise ConfigError(
            f"{what}: plain http:// to {host} would send tokens and data in clear, so "
            f"it is refused. Use https://, or, on a network you trust, list the host in "
            f"{INSECURE_HOSTS_ENV} (e.g. {host} or a CIDR such as 10.0.0.0/8) and "
            "restart the server"
        )
    return endpoint


def check_insecure_hosts(
    entries: Iterable[str], *, variable: str = INSECURE_HOSTS_ENV
) -> tuple[str, ...]:
    """The entries of a host list (`variable`: `GRAPH_KVCACHE_INSECURE_HTTP_HOSTS` or
    `GRAPH_KVCACHE_INSECURE_FEED_HOSTS`), normalised: IP addresses and CIDRs as `ipaddress`
    writes them, host names lower-case without a trailing dot.

    Raises:
        ConfigError: an entry is neither an address, a CIDR, nor a host name.
    """
    checked: list[str] = []
    for entry in (item.strip() for item in entries):
        if not entry:
            continue
        try:
            checked.append(str(ipaddress.ip_network(entry.strip("[]"), strict=False)))
            continue
        except ValueError:
            pass
        name = entry.lower().rstrip(".")
        if not _HOST_NAME.match(name):
            raise ConfigError(
                f"{variable}: {quoted(entry)} is not a host name, IP address or CIDR "
                "(write e.g. 10.0.0.18,gpu-box.lan,192.168.0.0/16)"
            )
        checked.append(name)
    return tuple(checked)


def plain_http_allowed(host: str, insecure_hosts: Sequence[str]) -> bool:
    """True for loopback, for an IP inside a listed address or CIDR, and for a listed name.

    A name in a URL matches only that name as listed, never what it resolves to.
    """
    if is_loopback_host(host):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host.lower().rstrip(".") in insecure_hosts
    for entry in insecure_hosts:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue  # a host name entry
    return False


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
            f"EPISTEMIC_GRAPH_KVCACHE_ADDR={quoted(addr)}: use a port (9130), host:port "
            "(127.0.0.1:9130) or an enable word (1, true)"
        )
    return f"http://{host}:{_port(port, addr)}"


def _port(text: str, original: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise ConfigError(f"EPISTEMIC_GRAPH_KVCACHE_ADDR={quoted(original)}: port must be 1-65535")
    return port
