"""The server's way to vLLM: one shared client (made on first use), the managed process of the
data dir, and this session's traces. It never starts vLLM by itself: `vllm_start` does, on request.

A call borrows the client for its whole length (`async with access.borrowed() as client:`). A
client is closed only once no call holds it: pointing the tools elsewhere (`use`) retires the old
client and the last borrower closes it; `aclose` refuses new borrowers and waits for the current
ones. The client module (and openai with it) is imported when the first client is made, so the
server starts without it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.vllm.traces import Trace
from graph_kvcache_mcp.errors import GraphKvcacheError

if TYPE_CHECKING:
    from graph_kvcache_mcp.connectors.vllm.accounting import TierCounters
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient

SESSION_TRACES = 10_000  # kept in memory for vllm_trace_summary; the oldest drop out first
CLOSE_WAIT_S = 5.0  # how long shutting down waits for running calls before closing under them


class VllmAccessClosed(GraphKvcacheError):
    """A call started after the server began shutting down."""


def open_client(settings: Settings, *, base_url: str | None = None) -> VllmClient:
    """A new client for `base_url` (default: the configured one); the caller closes it.

    Raises:
        ConfigError: the URL is not http(s), or plain http to a non-loopback host.
    """
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient  # openai loads here, once

    return VllmClient.from_settings(settings, base_url=base_url)


class _Lease:
    """One client and the calls holding it."""

    def __init__(self, client: VllmClient) -> None:
        self.client = client
        self.holders = 0
        self.retired = False
        self.closing = False
        self.closed = anyio.Event()

    async def close_when_free(self) -> None:
        if self.retired and self.holders == 0 and not self.closing:
            self.closing = True
            with anyio.CancelScope(shield=True):  # a cancelled last borrower still closes it
                await self.client.aclose()
            self.closed.set()


class VllmAccess:
    def __init__(
        self, settings: Settings, *, tier_for: Callable[[str], TierCounters | None] | None = None
    ) -> None:
        self.settings = settings
        self.tier_for = tier_for
        """The lmcache server behind the vLLM at a root URL, for the L1/L2 split of traces."""
        self.base_url = settings.vllm_base_url
        self.managed = ManagedVllm(
            settings.data_dir, python=settings.vllm_python, tidy=not settings.read_only
        )
        self.traces: deque[Trace] = deque(maxlen=SESSION_TRACES)
        self._lease: _Lease | None = None
        self._closing = False
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"VllmAccess({self.base_url!r})"

    @property
    def port(self) -> int:
        """The port of the base URL the tools talk to (where vllm_start serves by default)."""
        return parse_http_url(self.base_url, what="VLLM_BASE_URL").port

    @asynccontextmanager
    async def borrowed(self) -> AsyncIterator[VllmClient]:
        """The shared client, kept open until the block ends.

        Raises:
            VllmAccessClosed: the server is shutting down.
        """
        async with self._lock:
            if self._closing:
                raise VllmAccessClosed("the server is shutting down; vLLM calls are refused")
            if self._lease is None:
                client = open_client(self.settings, base_url=self.base_url)
                if self.tier_for is not None:
                    client.meter.tier = self.tier_for(client.root_url)
                self._lease = _Lease(client)
            lease = self._lease
            lease.holders += 1
        try:
            yield lease.client
        finally:
            lease.holders -= 1
            await lease.close_when_free()

    async def use(self, base_url: str) -> None:
        """Point the tools at another server (after vllm_start served on another port)."""
        async with self._lock:
            if base_url == self.base_url:
                return
            self.base_url = base_url
            await self._retire()

    async def aclose(self) -> None:
        """Refuse new calls, wait for the running ones (at most `CLOSE_WAIT_S`), then close."""
        # A vLLM started through the tools keeps running: it is slow to start and may serve
        # other clients. vllm_stop (or `graph-kvcache-mcp vllm stop`) ends it.
        # Shielded: the lifespan closes from a cancelled scope, and the cleanup after this one
        # (stopping a managed engine) must still run.
        with anyio.CancelScope(shield=True):
            async with self._lock:
                self._closing = True
                lease = self._lease
                await self._retire()
            if lease is None:
                return
            with anyio.move_on_after(CLOSE_WAIT_S):
                await lease.closed.wait()
            if not lease.closed.is_set():  # a call that ignored cancellation: close under it
                lease.holders = 0
                await lease.close_when_free()

    async def _retire(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.retired = True
            await lease.close_when_free()
