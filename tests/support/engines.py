"""Real engines for tests, started through the project's own managed-engine code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient, SyncKvClient
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.state import Backend


@dataclass(frozen=True)
class RunningEngine:
    """An engine a test can talk to: its URL, token, and settings pointing at it."""

    managed: ManagedEngine
    base_url: str
    token: SecretStr
    backend: Backend

    @property
    def settings(self) -> Settings:
        return Settings.build(
            kv_url=self.base_url, kv_token=self.token, data_dir=self.managed.data_dir
        )

    def sync_client(self, **kwargs: float) -> SyncKvClient:
        return SyncKvClient(self.base_url, self.token, **kwargs)  # type: ignore[arg-type]

    def client(self) -> KvClient:
        return KvClient(self.sync_client())


@contextmanager
def running_engine(
    data_dir: Path, backend: Backend, *, resp: bool = False
) -> Iterator[RunningEngine]:
    managed = ManagedEngine(data_dir)
    managed.start(backend=backend, resp=resp)
    state = managed.running_state()
    assert state is not None
    try:
        yield RunningEngine(managed, state.base_url, managed.token(), backend)
    finally:
        managed.stop(term_wait_s=5.0)


def require_in_ci(what: str) -> None:
    """Skip locally when `what` is missing; fail in CI, where everything must be present."""
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{what} is required in CI but missing")
    pytest.skip(f"{what} not available here (CI installs it)")
