"""How long what a stack start brings up lives: a strategy the caller picks once and the stack
asks, so no verb branches on which one it has.

`LeasedToSession`: an MCP session's start. The engine is the session's KV access (started on
first use, stopped when the last session leaves unless --keep-engine) and the lmcache server
runs under the session's lease. `RunsUntilStop`: the CLI's start. Each piece runs until its own
`stop` command. (The lease itself is `connectors.processes.lease_rules.SessionLease`.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Protocol

import anyio.to_thread

from graph_kvcache_mcp.connectors.engine.access import KvAccess
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.lmcache.access import LmcacheAccess
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus, LmcacheStopResult, RespPeer
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec
from graph_kvcache_mcp.errors import LmcacheProcessError

if TYPE_CHECKING:
    from graph_kvcache_mcp.services.stack.stack import Stack

Note = Callable[[str], None]


@dataclass(frozen=True)
class ServerLaunch:
    """The lmcache server to start: its spec and environment, the RESP peer when its L2 goes
    over the engine's RESP wire, and the plan's notes."""

    spec: ProcessSpec
    env: dict[str, str] = field(repr=False)  # holds the engine token or the RESP password
    peer: RespPeer | None = None
    notes: list[str] = field(default_factory=list)


class Lifetime(Protocol):
    """What the stack asks of a lifetime: the engine, and the lmcache server's start and stop."""

    def engine(self, stack: Stack) -> ManagedEngine:
        """The managed engine handle whose RESP wire a `redis_resp` server connects to."""
        ...

    async def ensure_engine(self, stack: Stack, *, resp: bool, progress: Note | None) -> bool:
        """Make sure the L2 engine answers (its RESP wire too when `resp`); True when this call
        started one that a failed start must stop again."""
        ...

    async def start_server(
        self, stack: Stack, server: ServerLaunch, *, ready_timeout_s: float
    ) -> LmcacheStatus: ...

    async def stop_server(self, stack: Stack, *, force: bool, wait_s: float) -> LmcacheStopResult:
        """Stop the server itself (nothing that depends on it: the stack orders that)."""
        ...

    async def withdraw_server(self, stack: Stack) -> LmcacheStopResult | None:
        """Undo this call's start of the server; None when another holder keeps it."""
        ...


@dataclass(frozen=True, slots=True)
class LeasedToSession:
    kv: KvAccess
    lmcache: LmcacheAccess

    def engine(self, stack: Stack) -> ManagedEngine:
        return self.kv.engine

    async def ensure_engine(self, stack: Stack, *, resp: bool, progress: Note | None) -> bool:
        if resp and stack.settings.kv_url is None:
            await self.kv.start_engine(resp=True)  # the RESP wire is the managed engine's
        else:
            await self.kv.client()
        return False  # the session's engine: its KV tools use it, it ends with the session

    async def start_server(
        self, stack: Stack, server: ServerLaunch, *, ready_timeout_s: float
    ) -> LmcacheStatus:
        spec, env, peer = server.spec, server.env, server.peer
        return await self.lmcache.start(
            spec, env=env, ready_timeout_s=ready_timeout_s, resp_peer=peer
        )

    async def stop_server(self, stack: Stack, *, force: bool, wait_s: float) -> LmcacheStopResult:
        return await self.lmcache.stop(force=force, term_wait_s=wait_s)

    async def withdraw_server(self, stack: Stack) -> LmcacheStopResult | None:
        try:
            return await self.lmcache.stop()
        except LmcacheProcessError:  # another session took it up meanwhile
            return None


@dataclass(frozen=True, slots=True)
class RunsUntilStop:
    def engine(self, stack: Stack) -> ManagedEngine:
        return stack.engine

    async def ensure_engine(self, stack: Stack, *, resp: bool, progress: Note | None) -> bool:
        if stack.settings.kv_url is not None:
            return False
        start = partial(stack.engine.start, resp=resp, progress=progress)
        return not (await anyio.to_thread.run_sync(start)).reused

    async def start_server(
        self, stack: Stack, server: ServerLaunch, *, ready_timeout_s: float
    ) -> LmcacheStatus:
        start = partial(stack.lmcache.start, server.spec, env=server.env, resp_peer=server.peer)
        return await anyio.to_thread.run_sync(partial(start, ready_timeout_s=ready_timeout_s))

    async def stop_server(self, stack: Stack, *, force: bool, wait_s: float) -> LmcacheStopResult:
        # runs until stop: stopped even while sessions use it
        return await anyio.to_thread.run_sync(partial(stack.lmcache.stop, term_wait_s=wait_s))

    async def withdraw_server(self, stack: Stack) -> LmcacheStopResult | None:
        return await anyio.to_thread.run_sync(stack.lmcache.stop)
