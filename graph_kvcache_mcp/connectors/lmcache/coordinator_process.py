"""The managed `lmcache coordinator`: started on loopback from LMCache's venv with the servers'
chunk size and hash, its checkpoint and metadata in our private data dir, reused while it runs,
stopped only by us. The plan is `domain.lmcache.coordinator_plan`.

It counts as started, and is reused, only while its process group holds every listening socket on
its port (`identity.listener_owner`): LMCache imports for seconds before it binds, and another user
watching for it could take the port first.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import private_dir
from graph_kvcache_mcp.connectors.processes.control import (
    ML_STACK_INHERITED,
    ML_STACK_INHERITED_PREFIXES,
    StopHow,
    inherited_environment,
    spawn_logged,
    stop_process,
    tail,
)
from graph_kvcache_mcp.connectors.processes.identity import (
    ListenerOwner,
    describe_listener,
    listener_owner,
)
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.processes.state_file import ProcessState, StateFile
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import (
    COORDINATOR_HOST,
    coordinator_spec,
    coordinator_url,
)
from graph_kvcache_mcp.errors import LmcacheProcessError

ENTRY_MODULE = "graph_kvcache_mcp.plugins.lmcache.coordinator"
"""LMCache's coordinator behind our owner-only filter (`plugins/lmcache/coordinator.py`)."""
READY_TIMEOUT_S = 60.0


class CoordinatorState(ProcessState):
    """`state.json`: the coordinator we started. Holds no secret (it has none)."""

    port: int
    url: str
    chunk_size: int
    hash_algorithm: str
    runs_until_stop: bool = False
    """Started (or adopted) by `lmcache coordinator start`: only `lmcache coordinator stop`
    stops it, never the stop of a server that joined it."""


class ManagedCoordinator:
    """The data dir's coordinator (under `<data_dir>/lmcache-coordinator`)."""

    def __init__(self, data_dir: Path, *, python: Path | str | None = None) -> None:
        self.home = data_dir.expanduser().resolve() / "lmcache-coordinator"
        self.state_file = StateFile(self.home / "state.json", CoordinatorState)
        self.log_path = self.home / "coordinator.log"
        self.python = str(python) if python else sys.executable

    def __repr__(self) -> str:
        return f"ManagedCoordinator({str(self.home)!r})"

    def running_state(self, *, tidy: bool = True) -> CoordinatorState | None:
        return self.state_file.read_live(tidy=tidy)

    def ensure(
        self,
        *,
        chunk_size: int,
        hash_algorithm: str,
        ready_timeout_s: float = READY_TIMEOUT_S,
        runs_until_stop: bool = False,
    ) -> CoordinatorState:
        """The running coordinator, or a new one; it must hash as the servers do.
        `runs_until_stop`: the coordinator (new or reused) is a service of its own from now on.

        Raises:
            LmcacheProcessError: the running one hashes differently, or a new one exited or did
                not answer in time (with the log's last words).
        """
        if (state := self.running_state()) is not None:
            if (state.chunk_size, state.hash_algorithm) != (chunk_size, hash_algorithm):
                raise LmcacheProcessError(
                    f"the managed lmcache coordinator (pid {state.process.pid}) hashes "
                    f"{state.chunk_size}-token chunks with {state.hash_algorithm}, the servers "
                    f"{chunk_size} with {hash_algorithm}: stop it (lmcache stop) and start again"
                )
            if (refusal := self.listener_refusal(state)) is not None:
                raise LmcacheProcessError(f"{refusal}; stop it (lmcache stop) and start again")
            if runs_until_stop and not state.runs_until_stop:
                state = state.model_copy(update={"runs_until_stop": True})
                self.state_file.write(state)
            return state
        private_dir(self.home)
        port = free_port()
        spec = coordinator_spec(
            port=port, state_dir=self.home, chunk_size=chunk_size, hash_algorithm=hash_algorithm
        )
        command = (self.python, "-m", ENTRY_MODULE, *spec.argv[1:])
        process, record = spawn_logged(
            command,
            env={
                **inherited_environment(ML_STACK_INHERITED, ML_STACK_INHERITED_PREFIXES),
                **spec.env,
            },
            log_path=self.log_path,
            header=f"\n=== graph-kvcache-mcp: {' '.join(command)}\n",
        )
        state = CoordinatorState(
            process=record,
            port=port,
            url=coordinator_url(port),
            chunk_size=chunk_size,
            hash_algorithm=hash_algorithm,
            runs_until_stop=runs_until_stop,
        )
        self.state_file.write(state)
        deadline = time.monotonic() + ready_timeout_s
        # LMCache imports for seconds before it binds: a process that binds the port first must
        # not be taken for it (our servers would register and post token ids there).
        while (
            owner := listener_owner(record.pid, port, group=True, host=COORDINATOR_HOST)
        ) != "ours" or not _answers(state.url):
            if owner == "foreign":
                holder = _holder(owner, port)
                self.stop()
                raise LmcacheProcessError(
                    f"another process ({holder}) took the lmcache coordinator's port {port} before "
                    "it bound: nothing was sent there; start again (a new port is picked)"
                )
            if process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LmcacheProcessError(
                    f"lmcache coordinator did not answer on {state.url}; its log ends:\n"
                    f"{tail(self.log_path)}"
                )
            time.sleep(0.2)  # polling a condition under a deadline
        return state

    def listener_refusal(self, state: CoordinatorState) -> str | None:
        """Why the recorded coordinator is not to be used (None when its process group holds
        every listening socket on its port)."""
        owner = listener_owner(state.process.pid, state.port, group=True, host=COORDINATOR_HOST)
        if owner == "ours":
            return None
        return (
            f"the managed lmcache coordinator (pid {state.process.pid}) does not hold its port "
            f"{state.port} ({_holder(owner, state.port)}): nothing is sent there"
        )

    def health(self, state: CoordinatorState) -> str | None:
        """Why the recorded coordinator is not serving (None when it holds its port and
        answers)."""
        if (refusal := self.listener_refusal(state)) is not None:
            return refusal
        return None if _answers(state.url) else f"it does not answer on {state.url}"

    def stop(self, *, term_wait_s: float = 10.0) -> bool:
        """Stop the coordinator we started (it writes its checkpoint on a clean stop)."""
        return self.stop_how(term_wait_s=term_wait_s) != "not_running"

    def stop_how(self, *, term_wait_s: float = 10.0) -> StopHow:
        """`stop`, saying how it went."""
        state = self.state_file.read_live()
        if state is None:
            return "not_running"
        how = stop_process(state.process, term_wait_s=term_wait_s)
        self.state_file.clear()
        return how

    def stop_if_joined(self, joined_url: str | None, *, term_wait_s: float = 10.0) -> int | None:
        """Stop our coordinator when it is the one at `joined_url` (what a server just stopped
        had joined): it ran for that server. Its pid; None for a coordinator named by
        configuration (never ours to stop), one that runs until `lmcache coordinator stop`, or
        none at all."""
        state = self.state_file.read_live()
        if state is None or joined_url != state.url or state.runs_until_stop:
            return None
        self.stop(term_wait_s=term_wait_s)
        return state.process.pid


def _holder(owner: ListenerOwner, port: int) -> str:
    return (
        "nothing listens there"
        if owner == "none"
        else describe_listener(port, host=COORDINATOR_HOST)
    )


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/instances", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False
