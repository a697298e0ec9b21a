"""The lookup counters of the `lmcache server` behind a vLLM or an engine: what splits a trace's
external hits into L1 and L2.

The server is a target resolved once by the caller: managed here (found again from the state
files on every read, behind the managed vLLM at that root) or configured (its URL, as given:
nothing here knows its process, so its own API is all there is to read).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from graph_kvcache_mcp.connectors.lmcache.admin_http import LmcacheHttp
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.lmcache.metrics import LmcacheCounters
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.targets import Configured, ManagedHere, Target
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint

if TYPE_CHECKING:  # openai loads with the first client, not with this module
    from graph_kvcache_mcp.connectors.vllm.accounting import TierCounters
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient


class ManagedServerCounters:
    """The lookup counters of the managed lmcache server that the managed vLLM at `vllm_root`
    talks to (found again on every read: the server may have been restarted meanwhile)."""

    def __init__(self, data_dir: Path, vllm_root: str) -> None:
        self.data_dir = data_dir
        self.vllm_root = vllm_root.rstrip("/")
        # Kept between reads: making an HTTP client costs ~20 ms of CPU (its TLS context), on
        # the event loop, after every chat call that splits its hit by tier.
        self._server: tuple[str, LmcacheHttp] | None = None  # its URL as the state files say
        self._moved_from: list[LmcacheHttp] = []  # a read may still use one: closed at aclose
        self._swap = anyio.Lock()

    def __repr__(self) -> str:
        return f"ManagedServerCounters({str(self.data_dir)!r}, {self.vllm_root!r})"

    async def read(self) -> LmcacheCounters | Unavailable | None:
        kept = self._server
        if kept is None:
            http_url = await anyio.to_thread.run_sync(self._http_url)
            return None if http_url is None else await self._read_from(http_url)
        # The server is found again (state files, in a thread) while the one found last time
        # answers: a chat call waits for the slower of the two, not both. Its answer counts
        # only if it is still vLLM's server.
        found: list[str | None] = []

        async def locate() -> None:
            found.append(await anyio.to_thread.run_sync(self._http_url))

        async with anyio.create_task_group() as group:
            group.start_soon(locate)
            counters = await kept[1].counters()
        if found[0] is None:
            return None
        return counters if found[0] == kept[0] else await self._read_from(found[0])

    async def _read_from(self, http_url: str) -> LmcacheCounters | Unavailable:
        async with self._swap:  # the server moved (a restart on another port): a new client
            if self._server is None or self._server[0] != http_url:
                if self._server is not None:
                    self._moved_from.append(self._server[1])
                self._server = (http_url, LmcacheHttp(http_url))
            server = self._server[1]
        return await server.counters()

    async def aclose(self) -> None:
        async with self._swap:
            kept, self._server = self._server, None
            clients = [*self._moved_from, *([kept[1]] if kept else [])]
            self._moved_from = []
        for client in clients:
            await client.aclose()

    def _http_url(self) -> str | None:
        vllm = ManagedVllm(self.data_dir, tidy=False).running_state()
        if vllm is None or VllmEndpoint.of(vllm.base_url).root != self.vllm_root:
            return None
        port = vllm.wiring.lmcache_port
        server = ManagedLmcache(self.data_dir).running_state(tidy=False)
        return server.http_url if server is not None and server.port == port else None


class ConfiguredServerCounters:
    """The lookup counters of a configured lmcache server, at its URL (one client, kept)."""

    def __init__(self, target: Configured) -> None:
        self.target = target
        # Made once with the vLLM client it meters (its TLS context costs ~20 ms of CPU), so
        # concurrent reads share it and no call pays for it.
        self._server = LmcacheHttp(target.url)

    def __repr__(self) -> str:
        return f"ConfiguredServerCounters({self.target.url!r})"

    async def read(self) -> LmcacheCounters | Unavailable:
        return await self._server.counters()

    async def aclose(self) -> None:
        await self._server.aclose()


def server_counters(server: Target, vllm_root: str) -> TierCounters:
    """The counters of `server`, the lmcache server behind the vLLM at `vllm_root`."""
    if isinstance(server, Configured):
        return ConfiguredServerCounters(server)
    return ManagedServerCounters(server.data_dir, vllm_root)


async def engine_l2_counters(server: Target, engine_url: str) -> LmcacheCounters | None:
    """The counters of the lmcache server `server` when its L2 adapter writes to `engine_url`
    (the mp_native stack), None when there is none, it writes elsewhere or it does not answer.
    The managed one's L2 is in its recorded wiring; a configured one's in what it reports."""
    engine_url = engine_url.rstrip("/")
    if isinstance(server, ManagedHere):
        http_url = await anyio.to_thread.run_sync(_managed_writing_to, server.data_dir, engine_url)
    else:
        http_url = server.url
    if http_url is None:
        return None
    async with LmcacheHttp(http_url) as http:
        if isinstance(server, Configured):
            wiring = await http.reported_wiring()
            l2 = None if isinstance(wiring, Unavailable) else wiring.l2_base_url
            if l2 is None or l2.rstrip("/") != engine_url:
                return None
        counters = await http.counters()
    return None if isinstance(counters, Unavailable) else counters


def _managed_writing_to(data_dir: Path, engine_url: str) -> str | None:
    server = ManagedLmcache(data_dir).running_state(tidy=False)
    if server is None:
        return None
    return server.http_url if server.wiring.l2_base_url == engine_url else None


def attach_lmcache_tier(client: VllmClient, server: Target) -> VllmClient:
    """`client` with its meter reading `server`, the lmcache server behind it (when it is one),
    so its traces split external hits into L1 and L2."""
    client.meter.tier = server_counters(server, client.root_url)
    return client
