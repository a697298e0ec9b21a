"""The server's way to vLLM: one shared client (created on first use), the managed process of the
data dir, and this session's traces. It never starts vLLM by itself: `vllm_start` does, on request.
"""

from __future__ import annotations

from collections import deque

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.vllm_openai import VllmClient
from graph_kvcache_mcp.connectors.vllm_process import ManagedVllm
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.traces import Trace

SESSION_TRACES = 10_000  # kept in memory for vllm_trace_summary; the oldest drop out first


class VllmAccess:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base_url = settings.vllm_base_url
        self.managed = ManagedVllm(settings.data_dir, python=settings.vllm_python)
        self.traces: deque[Trace] = deque(maxlen=SESSION_TRACES)
        self._client: VllmClient | None = None
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"VllmAccess({self.base_url!r})"

    @property
    def port(self) -> int:
        """The port of the base URL the tools talk to (where vllm_start serves by default)."""
        return parse_http_url(self.base_url, what="VLLM_BASE_URL").port

    async def client(self) -> VllmClient:
        async with self._lock:
            if self._client is None:
                self._client = VllmClient.from_settings(self.settings, base_url=self.base_url)
            return self._client

    async def use(self, base_url: str) -> None:
        """Point the tools at another server (after vllm_start served on another port)."""
        async with self._lock:
            if base_url == self.base_url:
                return
            self.base_url = base_url
            if self._client is not None:
                await self._client.aclose()
                self._client = None

    async def aclose(self) -> None:
        # A vLLM started through the tools keeps running: it is slow to start and may serve
        # other clients. vllm_stop (or `graph-kvcache-mcp vllm stop`) ends it.
        if self._client is not None:
            await self._client.aclose()
            self._client = None
