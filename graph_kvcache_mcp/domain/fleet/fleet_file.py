"""The fleet file: which vLLM instances form the fleet and where their KV event feeds are.

`{"instances": [{"name": "a", "base_url": "http://127.0.0.1:8001/v1",
"kv_events": "tcp://127.0.0.1:5557", "kv_events_replay": "tcp://127.0.0.1:5558",
"api_key_env": "A_KEY"}], "engine_url": null, "lmcache_url": null}`

Secrets are named by environment variable, never written inline. HTTP URLs follow the project's
policy (`domain/endpoints.py`); a ZMQ feed carries no authentication at all, so it must be a
loopback `tcp://` address, a host listed as insecure, or a local `ipc://` socket.

Across hosts (a node's `fleet_entry`, pasted as is): the top level names `tls_dir` (this host's
`fleet pki issue` output), every https URL is then reached with mutual TLS, and a feed may be
`tls://HOST:PORT`, read through this host's edge (`domain.fleet.feed_routes`) and checked
against the instance's `tls_name`. An instance is a vLLM target, its LMCache server's target and
its feeds (`Fleet.vllm_target`, `Fleet.lmcache_target`).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graph_kvcache_mcp.domain.edge.pki import check_host_name
from graph_kvcache_mcp.domain.endpoints import (
    FEED_HOSTS_ENV,
    approve_http_url,
    plain_http_allowed,
)
from graph_kvcache_mcp.domain.targets import Configured, TlsIdentity
from graph_kvcache_mcp.errors import ConfigError, InvalidValue, describe_validation

FLEET_ENV = "GRAPH_KVCACHE_FLEET"
TLS_FEED_SCHEME = "tls://"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_INLINE_SECRETS = frozenset({"api_key", "token", "key", "password", "kv_token", "engine_token"})


class FleetInstance(BaseModel):
    """One vLLM instance of the fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Short unique name the answers use.")
    tls_name: str | None = Field(
        None, description="The DNS name in its host's fleet certificate (tls:// feeds)."
    )
    base_url: str = Field(description="The instance's OpenAI base URL (…/v1).")
    kv_events: str | None = Field(
        None, description="Its KV event PUB endpoint (tcp://, ipc:// or tls://HOST:PORT)."
    )
    kv_events_replay: str | None = Field(None, description="Its replay ROUTER endpoint.")
    api_key_env: str | None = Field(None, description="Environment variable holding its API key.")
    lmcache_http_url: str | None = Field(
        None, description="Its LMCache server's HTTP API (L1/L2 tiers in fleet where)."
    )

    def feeds(self) -> tuple[str, ...]:
        """Its feed endpoints as the file names them (live first)."""
        return tuple(e for e in (self.kv_events, self.kv_events_replay) if e is not None)


class Fleet(BaseModel):
    """The whole fleet file, checked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instances: tuple[FleetInstance, ...] = Field(min_length=1)
    tls_dir: str | None = Field(
        None,
        description="This host's TLS dir (ca.pem, cert.pem, key.pem from `fleet pki issue`): "
        "every https URL and tls:// feed of the file is reached with it (mutual TLS).",
    )
    engine_url: str | None = None
    engine_token_env: str | None = None
    lmcache_url: str | None = None
    coordinator_url: str | None = Field(
        None, description="LMCache coordinator for L1 (default: the one each server joined)."
    )

    def instance(self, name: str) -> FleetInstance:
        """The instance called `name`.

        Raises:
            ConfigError: no instance has that name.
        """
        for item in self.instances:
            if item.name == name:
                return item
        known = ", ".join(i.name for i in self.instances)
        raise ConfigError(f"the fleet has no instance {name!r} (it has {known})")

    def identity(self, peer_name: str | None = None) -> TlsIdentity | None:
        """How this file's https URLs (`peer_name` None: checked by address) and an instance's
        tls:// feeds (`peer_name`: its `tls_name`) are reached; None without `tls_dir`."""
        return None if self.tls_dir is None else TlsIdentity(Path(self.tls_dir), peer_name)

    def vllm_target(self, item: FleetInstance) -> Configured:
        """`item`'s vLLM as a target: named by URL, run by whoever runs it."""
        return Configured("vLLM", item.base_url, self._tls_for(item.base_url))

    def lmcache_target(self, item: FleetInstance) -> Configured | None:
        """`item`'s LMCache server as a target, when the file names one."""
        url = item.lmcache_http_url
        return None if url is None else Configured("lmcache server", url, self._tls_for(url))

    def _tls_for(self, url: str) -> TlsIdentity | None:
        return self.identity() if url.lower().startswith("https://") else None


def parse_fleet(
    text: str,
    *,
    source: str,
    insecure_hosts: Sequence[str] = (),
    feed_hosts: Sequence[str] = (),
) -> Fleet:
    """The fleet described by the JSON `text` (`source` names it in messages); `insecure_hosts`
    may get plain http, `feed_hosts` may be read for KV events (two lists, two risks).

    Raises:
        ConfigError: not JSON, a wrong shape, an inline secret, a duplicate name, or an
            endpoint the URL policy refuses; the message says which entry and how to fix it.
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    _refuse_inline_secrets(raw, source)
    try:
        fleet = Fleet.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation(exc, whole='fleet')}") from exc
    names = [i.name for i in fleet.instances]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"{source}: instance names must be unique ({', '.join(dupes)} repeat)")
    for item in fleet.instances:
        what = f"{source}: instance {item.name!r}"
        if not _NAME.match(item.name):
            raise ConfigError(f"{what}: use letters, digits, '.', '_' or '-' for the name")
        approve_http_url(item.base_url, what=f"{what} base_url", insecure_hosts=insecure_hosts)
        _check_tls_name(item, what)
        for field, endpoint in (
            ("kv_events", item.kv_events),
            ("kv_events_replay", item.kv_events_replay),
        ):
            if endpoint is None:
                continue
            if endpoint.startswith(TLS_FEED_SCHEME):
                _check_tls_feed(fleet, item, endpoint, what=f"{what} {field}")
            else:
                check_zmq_endpoint(endpoint, what=f"{what} {field}", feed_hosts=feed_hosts)
        if item.kv_events_replay and not item.kv_events:
            raise ConfigError(f"{what}: kv_events_replay needs kv_events (the live feed) too")
        _check_env_name(item.api_key_env, f"{what} api_key_env")
        if item.lmcache_http_url is not None:
            approve_http_url(
                item.lmcache_http_url,
                what=f"{what} lmcache_http_url",
                insecure_hosts=insecure_hosts,
            )
    for field, url in (
        ("engine_url", fleet.engine_url),
        ("lmcache_url", fleet.lmcache_url),
        ("coordinator_url", fleet.coordinator_url),
    ):
        if url is not None:
            approve_http_url(url, what=f"{source}: {field}", insecure_hosts=insecure_hosts)
    _check_env_name(fleet.engine_token_env, f"{source}: engine_token_env")
    if fleet.tls_dir is not None and not Path(fleet.tls_dir).is_absolute():
        raise ConfigError(
            f"{source}: tls_dir {fleet.tls_dir!r} must be an absolute path (the dir `fleet pki "
            "issue --out` wrote), so the file means the same from any working directory"
        )
    return fleet


def tls_feed_address(endpoint: str, *, what: str) -> tuple[str, int]:
    """The IPv4 address and port of a `tls://HOST:PORT` feed (the edge routes IPv4 for now).

    Raises:
        ConfigError: malformed, no port, or a host that is not an IPv4 address.
    """
    parts = urlsplit(endpoint)
    form = "tls://10.0.0.2:8101 (a node's fleet_entry gives it)"
    try:
        port = parts.port
        address = ipaddress.IPv4Address(parts.hostname or "")
    except ValueError:
        raise ConfigError(f"{what}: {endpoint!r} must look like {form}") from None
    if port is None or parts.path or parts.query or address.is_unspecified:
        raise ConfigError(f"{what}: {endpoint!r} must look like {form}")
    return str(address), port


def _check_tls_feed(fleet: Fleet, item: FleetInstance, endpoint: str, *, what: str) -> None:
    """A `tls://` feed is read through this host's edge with this host's certificate, and the
    peer's is checked against the instance's name: both must be in the file."""
    tls_feed_address(endpoint, what=what)
    if fleet.tls_dir is None:
        raise ConfigError(
            f"{what}: a tls:// feed is read with mutual TLS, so the fleet file needs a top-level "
            '"tls_dir": this host\'s TLS dir (`fleet pki issue --name NAME --out DIR`)'
        )
    if item.tls_name is None:
        raise ConfigError(
            f"{what}: a tls:// feed needs the instance's tls_name (the DNS name in its host's "
            "certificate, as its fleet_entry gives it)"
        )


def _check_tls_name(item: FleetInstance, what: str) -> None:
    if item.tls_name is None:
        return
    try:
        check_host_name(item.tls_name)
    except InvalidValue as exc:
        raise ConfigError(f"{what} tls_name: {exc}") from None


def check_zmq_endpoint(endpoint: str, *, what: str, feed_hosts: Sequence[str] = ()) -> None:
    """Refuse a ZMQ endpoint we should not connect to: ZMQ has no authentication here, so only
    loopback (or a host listed in `GRAPH_KVCACHE_INSECURE_FEED_HOSTS`) over tcp, or a local ipc
    socket. The plain-http list has no say here.

    Raises:
        ConfigError: malformed, a wildcard, or a host the policy refuses.
    """
    if endpoint.startswith("ipc://"):
        if len(endpoint) <= len("ipc://"):
            raise ConfigError(f"{what}: {endpoint!r} names no socket path")
        return
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or not parts.hostname or parts.path or parts.query:
        raise ConfigError(
            f"{what}: {endpoint!r} must look like tcp://127.0.0.1:5557 or ipc:///path/socket"
        )
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        raise ConfigError(f"{what}: {endpoint!r} needs a port (tcp://HOST:PORT)")
    if "*" in parts.netloc:
        raise ConfigError(
            f"{what}: {endpoint!r} is vLLM's bind address; give the address to connect to "
            f"(tcp://127.0.0.1:{port} for a local instance)"
        )
    if not plain_http_allowed(parts.hostname, feed_hosts):
        raise ConfigError(
            f"{what}: KV event feeds are unauthenticated, so only loopback hosts (or hosts "
            f"listed in {FEED_HOSTS_ENV}) may be read; tunnel the feed to 127.0.0.1 instead of "
            f"reading {parts.hostname} directly, or, on a network you trust, list the host in "
            f"{FEED_HOSTS_ENV}"
        )


def _check_env_name(name: str | None, what: str) -> None:
    if name is not None and not _ENV_NAME.match(name):
        raise ConfigError(f"{what}: {name!r} is not an environment variable name")


def _refuse_inline_secrets(raw: Any, source: str) -> None:
    entries = [raw] if isinstance(raw, dict) else []
    if isinstance(raw, dict) and isinstance(raw.get("instances"), list):
        entries += [item for item in raw["instances"] if isinstance(item, dict)]
    for entry in entries:
        if found := sorted(_INLINE_SECRETS & set(entry)):
            raise ConfigError(
                f"{source}: {found[0]!r} would put a secret in the file; name the environment "
                "variable that holds it instead (api_key_env / engine_token_env)"
            )
