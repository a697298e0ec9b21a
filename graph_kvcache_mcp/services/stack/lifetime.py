"""How long what a stack start brings up lives: the one policy value a caller passes in.

`SessionLease`: an MCP session's start. The engine is the session's KV access (started on first
use, stopped when the last session leaves unless --keep-engine) and the lmcache server runs
under the session's lease. `RunsUntilStop`: the CLI's start. Each piece runs until its own
`stop` command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from graph_kvcache_mcp.connectors.engine.access import KvAccess
from graph_kvcache_mcp.connectors.lmcache.access import LmcacheAccess


@dataclass(frozen=True, slots=True)
class SessionLease:
    kv: KvAccess
    lmcache: LmcacheAccess


@dataclass(frozen=True, slots=True)
class RunsUntilStop:
    pass


Lifetime: TypeAlias = SessionLease | RunsUntilStop
