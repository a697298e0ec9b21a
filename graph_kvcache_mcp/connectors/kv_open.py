"""Which engine to talk to, and one place that opens a client for it (CLI, server and tools).

Order: a configured URL (`EPISTEMIC_GRAPH_KVCACHE_URL` / `_ADDR`) > the managed engine recorded in
the data dir > the engine's default address, http://127.0.0.1:9130.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine_process import ManagedEngine
from graph_kvcache_mcp.connectors.kv_http import KvClient, SyncKvClient
from graph_kvcache_mcp.domain.endpoints import DEFAULT_KV_HOST, DEFAULT_KV_PORT


@dataclass(frozen=True)
class KvTarget:
    base_url: str
    token: SecretStr | None
    source: Literal["configured", "managed", "default"]

    def __repr__(self) -> str:
        return f"KvTarget({self.base_url!r}, source={self.source!r})"


def resolve_kv_target(settings: Settings) -> KvTarget:
    """Pick the engine per the precedence above (reads the data dir's state file)."""
    if settings.kv_url is not None:
        return KvTarget(settings.kv_url, settings.kv_token, "configured")
    managed = ManagedEngine(settings.data_dir)
    if (state := managed.running_state()) is not None:
        return KvTarget(state.base_url, managed.token(), "managed")
    return KvTarget(f"http://{DEFAULT_KV_HOST}:{DEFAULT_KV_PORT}", settings.kv_token, "default")


def sync_client_for(target: KvTarget, settings: Settings) -> SyncKvClient:
    return SyncKvClient(
        target.base_url,
        target.token,
        timeout_s=settings.kv_timeout_s,
        concurrency=settings.kv_concurrency,
    )


@asynccontextmanager
async def open_kv_client(settings: Settings) -> AsyncIterator[KvClient]:
    """An async client for the resolved engine, closed on exit."""
    client = KvClient(sync_client_for(resolve_kv_target(settings), settings))
    try:
        yield client
    finally:
        await client.aclose()
