"""Which engine to talk to, and one place that opens a client for it (CLI, server and tools).

Order: a configured URL (`EPISTEMIC_GRAPH_KVCACHE_URL` / `_ADDR`) > the managed engine recorded in
the data dir > the engine's default address, http://127.0.0.1:9130.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.children.proof import ENGINE_DIR_VARIABLE, engine_proof
from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls
from graph_kvcache_mcp.domain.endpoints import (
    DEFAULT_KV_HOST,
    DEFAULT_KV_PORT,
    INSECURE_HOSTS_ENV,
    url_from_addr,
)
from graph_kvcache_mcp.domain.engine.environment import KV_TIMEOUT_ENV, KV_TOKEN_ENV, KV_URL_ENV
from graph_kvcache_mcp.domain.engine.limits import EngineBackend
from graph_kvcache_mcp.domain.targets import Configured, ManagedHere, Source, Target


@dataclass(frozen=True)
class KvTarget:
    """The engine to talk to, resolved once and passed down: where it answers, the token a client
    sends, and where the address came from (`domain.targets.Source`). `target` is the same engine
    in the vocabulary vLLM, the lmcache server and the coordinator share."""

    base_url: str
    token: SecretStr | None
    source: Source
    backend: EngineBackend | None = None
    """Known for a managed engine (its state records it); else the client learns it."""
    token_file: Path | None = None
    """A managed engine's token file, named when the engine refuses the token."""
    data_dir: Path | None = None
    """The data dir whose state records a managed engine (set exactly when it is managed)."""

    def __post_init__(self) -> None:
        if (self.source == "managed") != (self.data_dir is not None):
            raise ValueError("a managed engine target names the data dir that records it")

    def __repr__(self) -> str:
        return f"KvTarget({self.base_url!r}, source={self.source!r})"

    @property
    def target(self) -> Target:
        """ManagedHere (this data dir started it) or Configured (a setting, or the default)."""
        if self.data_dir is not None:
            return ManagedHere("engine", self.data_dir, self.base_url)
        return Configured("engine", self.base_url)


def resolve_kv_target(settings: Settings) -> KvTarget:
    """Pick the engine per the precedence above (reads the data dir's state file and the managed
    engine's token). Once per call or start: pass the result down, never resolve it again."""
    if settings.kv_url is not None:
        return KvTarget(settings.kv_url, settings.kv_token, "configured")
    managed = ManagedEngine(settings.data_dir)
    if (state := managed.running_state()) is not None:
        return KvTarget(
            state.base_url,
            managed.token(),
            "managed",
            state.backend,
            managed.token_path,
            data_dir=settings.data_dir,
        )
    return KvTarget(f"http://{DEFAULT_KV_HOST}:{DEFAULT_KV_PORT}", settings.kv_token, "default")


def engine_environment(target: KvTarget, settings: Settings) -> dict[str, str]:
    """What a process we launch (vLLM with the engine as its KV tier) needs to reach `target`;
    holds the token, so it goes only into that process's environment."""
    env = {
        KV_URL_ENV: target.base_url,
        KV_TIMEOUT_ENV: f"{settings.kv_timeout_s:g}",
    }
    if target.token is not None:
        env[KV_TOKEN_ENV] = target.token.get_secret_value()
    env.update(engine_proof_environment(target, settings.insecure_http_hosts))
    return env


def engine_proof_environment(
    target: KvTarget, insecure_hosts: Sequence[str] = ()
) -> dict[str, str]:
    """For a child that talks to the engine (the lmcache server's L2 adapter, vLLM with our
    connector): where the managed engine's record lives, so the child proves the engine holds
    its port before each token leaves (`children.proof`); and the hosts the user allowed plain
    http to, so the child's client applies the very policy ours does (its URL passed ours).

    The CA settings a child needs for https (`SSL_CERT_FILE`, `SSL_CERT_DIR`) it inherits
    (`processes.control.ML_STACK_INHERITED`)."""
    where = target.target
    env = {ENGINE_DIR_VARIABLE: str(where.data_dir)} if isinstance(where, ManagedHere) else {}
    if insecure_hosts:
        env[INSECURE_HOSTS_ENV] = ",".join(insecure_hosts)
    return env


def sync_client_for(
    target: KvTarget,
    settings: Settings,
    *,
    proved: bool = False,
    tls: ClientTls | None = None,
) -> SyncKvClient:
    """A blocking client for `target`; `proved`: inside a child we started, through the proof
    its environment asks for (`children.proof.engine_proof`); `tls`: a fleet's mutual TLS."""
    return SyncKvClient(
        target.base_url,
        target.token,
        timeout_s=settings.kv_timeout_s,
        concurrency=settings.kv_concurrency,
        source=target.source,
        backend=target.backend,
        proof=engine_proof(os.environ) if proved else None,
        token_file=target.token_file,
        tls=tls,
    )


def sync_client_from_params(
    *,
    base_url: str | None = None,
    addr: str | None = None,
    token: str | None = None,
    timeout_s: float | None = None,
    concurrency: int | None = None,
) -> SyncKvClient:
    """A blocking client for explicit parameters (an LMCache adapter's), the environment and
    then the usual precedence filling whatever is not given.

    Raises:
        ConfigError: a parameter (URL, address, number) cannot be used as given.
    """
    url = base_url or (url_from_addr(addr) if addr else None)
    settings = Settings.from_env(
        kv_url=url,
        kv_token=SecretStr(token) if token else None,
        kv_timeout_s=timeout_s,
        kv_concurrency=concurrency,
    )
    return sync_client_for(resolve_kv_target(settings), settings, proved=True)


@asynccontextmanager
async def open_kv_client(
    settings: Settings, *, tls: ClientTls | None = None
) -> AsyncIterator[KvClient]:
    """An async client for the resolved engine, closed on exit; `tls`: a fleet's mutual-TLS
    context (`connectors.net.tls_client`) for an engine on another host."""
    client = KvClient(sync_client_for(resolve_kv_target(settings), settings, tls=tls))
    try:
        yield client
    finally:
        await client.aclose()
