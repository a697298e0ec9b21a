"""The fleet file: which vLLM instances form the fleet and where their KV event feeds are.

`{"instances": [{"name": "a", "base_url": "http://127.0.0.1:8001/v1",
"kv_events": "tcp://127.0.0.1:5557", "kv_events_replay": "tcp://127.0.0.1:5558",
"api_key_env": "A_KEY"}], "engine_url": null, "lmcache_url": null}`

Secrets are named by environment variable, never written inline. HTTP URLs follow the project's
policy (`domain/endpoints.py`); a ZMQ feed carries no authentication at all, so it must be a
loopback `tcp://` address, a host listed as insecure, or a local `ipc://` socket.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graph_kvcache_mcp.domain.endpoints import (
    FEED_HOSTS_ENV,
    approve_http_url,
    plain_http_allowed,
)
from graph_kvcache_mcp.domain.targets import Configured
from graph_kvcache_mcp.errors import ConfigError, describe_validation

FLEET_ENV = "GRAPH_KVCACHE_FLEET"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_INLINE_SECRETS = frozenset({"api_key", "token", "key", "password", "kv_token", "engine_token"})


class FleetInstance(BaseModel):
    """One vLLM instance of the fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Short unique name the answers use.")
    base_url: str = Field(description="The instance's OpenAI base URL (…/v1).")
    kv_events: str | None = Field(None, description="Its KV event PUB endpoint (tcp:// or ipc://).")
    kv_events_replay: str | None = Field(None, description="Its replay ROUTER endpoint.")
    api_key_env: str | None = Field(None, description="Environment variable holding its API key.")
    lmcache_http_url: str | None = Field(
        None, description="Its LMCache server's HTTP API (L1/L2 tiers in fleet where)."
    )

    @property
    def vllm(self) -> Configured:
        """Its vLLM as a target: named by URL, run by whoever runs it."""
        return Configured("vLLM", self.base_url)

    @property
    def lmcache(self) -> Configured | None:
        """Its LMCache server as a target, when the fleet file names one."""
        url = self.lmcache_http_url
        return None if url is None else Configured("lmcache server", url)


class Fleet(BaseModel):
    """The whole fleet file, checked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instances: tuple[FleetInstance, ...] = Field(min_length=1)
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
        for field, endpoint in (
            ("kv_events", item.kv_events),
            ("kv_events_replay", item.kv_events_replay),
        ):
            if endpoint is not None:
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
    return fleet


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
