"""Before the engine token leaves a child we started: proof the managed engine holds the port.

The `lmcache server` (its L2 adapter) and vLLM (`EngineKVConnector`) we start send the engine's
bearer token and KV pages on every request. A URL and a token alone would follow the port: once
the engine stops, whoever binds that port next receives both. So those children are told the
managed engine's data dir (`ENGINE_DIR_VARIABLE`, set by `opener.engine_environment` and the
lmcache plan) and their client asks `ManagedEngineProof` for its wire instead:

- proof: the data dir's state record names a live process that is ours (`identity.is_ours`: our
  user, its start time, the nonce in its environment), and every listening socket on its address
  and port is that process's (`readiness.listener_refusal`). Only then is a wire built, with the
  URL the record holds and the token read from the engine's own token file at that moment, so a
  restarted engine (new port, new token) is followed without restarting the children;
- between requests: each request checks, after its connection is made and before a byte goes out,
  that the proved process still lives (a pidfd poll, one syscall). While it lives the port is its
  (another user cannot bind a port our process listens on), so the connection reached it;
- after a connection failure the proof is dropped and made again before the next request; a
  refusal is cached for `_REFUSAL_HOLD_S` so a dead engine costs a busy child little.

A child given no data dir (a configured engine, `EPISTEMIC_GRAPH_KVCACHE_URL`) keeps its plain
wire: the user named that engine.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.engine.wire import EngineWire
from graph_kvcache_mcp.connectors.processes.identity import ProcessRecord, is_alive, is_ours
from graph_kvcache_mcp.domain.endpoints import parse_http_url

ENGINE_DIR_VARIABLE = "EPISTEMIC_GRAPH_KVCACHE_ENGINE_DIR"
"""The data dir of the managed engine a child process must prove before it sends the token."""
_REFUSAL_HOLD_S = 0.5


class _ProcessLife:
    """Whether one process still lives: a pidfd when the platform has them (no pid reuse can
    fool it), else its pid and start time."""

    def __init__(self, record: ProcessRecord) -> None:
        self.record = record
        self._fd: int | None = None
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self._fd = os.pidfd_open(record.pid)

    def __del__(self) -> None:
        # Closed only when no wire can use it any more: a closed number reused by another file
        # could otherwise read as a live engine.
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def alive(self) -> bool:
        if self._fd is None:
            return is_alive(self.record.pid, self.record.start_ticks)
        # A pidfd turns readable when its process exits.
        readable, _, _ = select.select([self._fd], [], [], 0)
        return not readable


class ManagedEngineProof:
    """Hands out a wire to the data dir's managed engine only while it is proved to hold its
    port (see the module docstring). Thread-safe."""

    def __init__(self, data_dir: Path) -> None:
        self.engine = ManagedEngine(data_dir)
        self._lock = threading.Lock()
        self._wire: EngineWire | None = None
        self._refusal: tuple[str, float] | None = None

    def __repr__(self) -> str:
        return f"ManagedEngineProof({str(self.engine.data_dir)!r})"

    def wire(self) -> EngineWire | str:
        """The proved engine's wire, or why no token may be sent now."""
        with self._lock:
            if self._wire is not None:
                return self._wire
            if self._refusal is not None and time.monotonic() < self._refusal[1]:
                return self._refusal[0]
            proved = self._prove()
            if isinstance(proved, str):
                self._refusal = (proved, time.monotonic() + _REFUSAL_HOLD_S)
            else:
                self._wire, self._refusal = proved, None
            return proved

    def forget(self, wire: EngineWire) -> None:
        """Drop the proof `wire` was built on (its connection failed): the next request proves
        the engine again. A newer proof is kept."""
        with self._lock:
            if self._wire is wire:
                self._wire = None

    def _prove(self) -> EngineWire | str:
        state = self.engine.running_state(tidy=False)  # a child never edits the records
        if state is None:
            return (
                f"no managed engine runs for {self.engine.data_dir}: the engine token is sent "
                "to no one else (start it with `graph-kvcache-mcp engine start`)"
            )
        life = _ProcessLife(state.process)
        # Checked after the pidfd is open, so the fd names the process that passed the check.
        if not is_ours(state.process):
            return f"the managed engine (pid {state.process.pid}) has exited"
        if (why := self.engine.impostor(state)) is not None:
            return why
        endpoint = parse_http_url(state.base_url, what="managed engine URL")
        return EngineWire(endpoint, self.engine.existing_token(), still_held=life.alive)


def engine_proof(environ: Mapping[str, str]) -> ManagedEngineProof | None:
    """The proof a child must make before it sends the token, when it was started to use a
    managed engine (`ENGINE_DIR_VARIABLE` set); None for a configured engine."""
    data_dir = environ.get(ENGINE_DIR_VARIABLE, "").strip()
    return ManagedEngineProof(Path(data_dir)) if data_dir else None
