"""A start of the managed engine in a worker thread of its own, so no call waits past its deadline.

`ManagedKvAccess` begins one `EngineRestart` at a time; callers poll `done` within their own
deadline and read the result once it is set. The start goes on in the background after a call
gives up, and the next call after it uses the new engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.engine.state import EngineState, EngineStatus
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import EngineProcessError, GraphKvcacheError

StateStamp = tuple[int, int, int]
"""(inode, mtime in ns, size) of the state file: any rewrite of it changes the stamp."""


@dataclass(frozen=True)
class Binding:
    """The managed engine the shared client points at, as the state file recorded it."""

    state: EngineState
    stamp: StateStamp | None


@dataclass
class EngineRestart:
    """A start of the managed engine running in a worker thread; its result is read once done."""

    lost: Binding | None
    began: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    status: EngineStatus | None = None
    error: GraphKvcacheError | None = None
    outcome: KvClient | Unavailable | None = None
    """What every caller that waited for this restart gets, set by the first one to finish it."""

    @classmethod
    def begin(cls, start: Callable[[], EngineStatus], lost: Binding | None) -> EngineRestart:
        restart = cls(lost)

        def run() -> None:
            try:
                restart.status = start()
            except GraphKvcacheError as exc:  # the engine's or a state path's own reason
                restart.error = exc
            except Exception as exc:
                restart.error = EngineProcessError(f"{type(exc).__name__}: {exc}")
            finally:
                restart.done.set()

        threading.Thread(target=run, name="engine-restart", daemon=True).start()
        return restart

    def pending_reason(self, waited_s: float) -> str:
        what = "restarting" if self.lost is not None else "starting"
        return (
            f"engine {what}: the managed engine has been starting for "
            f"{time.monotonic() - self.began:.1f} s and did not answer within this call's "
            f"{waited_s:g} s deadline (EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S); the start goes on in "
            "the background, try again shortly"
        )
