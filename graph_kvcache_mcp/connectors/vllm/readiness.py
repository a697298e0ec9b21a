"""Whether the server on a port is the vLLM we started and healthy, and what status says of it.

A start counts as ready once `GET /health` answers 200 **and** the port's listening socket is
proved to belong to the process group we started (`listener_owner`): a squatter that took the
port first is never sent anything (no API key), and the start fails naming it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx2

from graph_kvcache_mcp.connectors.processes.identity import (
    describe_listener,
    is_ours,
    listener_owner,
)
from graph_kvcache_mcp.connectors.processes.shared_memory import SegmentWatch
from graph_kvcache_mcp.connectors.processes.status import running_fields
from graph_kvcache_mcp.connectors.vllm.health import last_log_line, probe_server, vllm_reason
from graph_kvcache_mcp.connectors.vllm.platform import VLLM_HOST
from graph_kvcache_mcp.connectors.vllm.state import VllmState, VllmStatus
from graph_kvcache_mcp.domain.vllm.endpoint import VllmEndpoint
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.errors import VllmProcessError

if TYPE_CHECKING:
    from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm, WaitProgress


def wait_healthy(
    vllm: ManagedVllm,
    process: subprocess.Popen[bytes] | None,
    state: VllmState,
    timeout_s: float,
    note: WaitProgress,
    began: float,
) -> set[str]:
    """Return once the vLLM we started answers /health on a port its group holds, with the
    shared-memory segments its group mapped meanwhile; else stop it and remove what it left.

    Raises:
        VllmProcessError: it exited, another process took its port, or it was not healthy
            within `timeout_s` of `began`.
    """
    deadline = began + timeout_s
    health_url = VllmEndpoint.of(state.base_url).root + "/health"
    next_note = time.monotonic() + 5.0
    watch = SegmentWatch(state.process.pid)
    with httpx2.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            exited = process.poll() if process is not None else None
            if exited is not None or not is_ours(state.process):
                vllm.state_file.clear()
                vllm.remove_leftovers(state, watch.seen)
                code = f"code {exited}" if exited is not None else "an unknown code"
                raise VllmProcessError(
                    f"vLLM exited with {code} before it was healthy: "
                    f"{vllm_reason(vllm.log_path)} (log: {vllm.log_path})"
                )
            owner = listener_owner(state.process.pid, state.port, group=True)
            if owner == "foreign":
                # A squatter took the port first: nothing (no API key) is sent there.
                holder = describe_listener(state.port)
                vllm.abandon(state, watch.seen)
                raise VllmProcessError(
                    f"port {state.port} on {VLLM_HOST} was taken by another process "
                    f"({holder}) while vLLM started; vLLM was stopped and nothing was sent "
                    "to that port. Start again on another port"
                )
            try:
                if owner == "ours" and http.get(health_url).status_code == 200:
                    return watch.sample(now=True)
            except httpx2.HTTPError:
                pass
            now = time.monotonic()
            if now >= next_note:
                note(
                    now - began,
                    timeout_s,
                    f"waiting for vLLM /health ({last_log_line(vllm.log_path)})",
                )
                next_note = now + 5.0
            watch.sample()
            time.sleep(0.25)  # poll interval; the deadline above bounds the wait
    vllm.abandon(state, watch.seen)
    raise VllmProcessError(
        f"vLLM was not healthy on port {state.port} within {timeout_s:g} s and was stopped; "
        f"its log says: {vllm_reason(vllm.log_path)} (log: {vllm.log_path})"
    )


def status_of(
    state: VllmState, data_dir: Path, *, reachable: bool, served: list[str], reason: str | None
) -> VllmStatus:
    """The status of the vLLM we started, from its record and what its port answered."""
    return VllmStatus(
        **running_fields(state.process, data_dir),
        reachable=reachable,
        port=state.port,
        base_url=state.base_url,
        model=state.model,
        served_models=served,
        platform=state.platform,
        notes=state.notes,
        dev_mode=state.dev_mode,
        prompt_tokens_details=state.prompt_tokens_details,
        kv_events=state.kv_events,
        kv_events_replay=state.kv_events_replay,
        reason=reason,
    )


def foreign_status(port: int, data_dir: Path) -> VllmStatus:
    """The status of a server on `port` that this tool did not start (never signalled)."""
    base_url = VllmEndpoint.local(VLLM_HOST, port).api_base
    healthy, served, reason = probe_server(base_url)
    holder = describe_listener(port)
    return VllmStatus(
        running=True,
        reachable=healthy,
        managed_by_us=False,
        port=port,
        base_url=base_url,
        served_models=served,
        data_dir=str(data_dir),
        reason=(
            f"a server this tool did not start answers on port {port} ({holder})"
            if healthy
            else f"port {port} is held by a process this tool did not start ({holder}) and "
            f"it is not a healthy vLLM: {reason}"
        ),
    )


def reuse_foreign(launch: VllmLaunch, wanted: str, data_dir: Path) -> VllmStatus:
    """The healthy vLLM serving `wanted` on `launch.port` that this tool did not start, as a
    status to reuse; anything else on that port is refused, never signalled."""
    base_url = VllmEndpoint.local(VLLM_HOST, launch.port).api_base
    healthy, served, _reason = probe_server(base_url)
    holder = describe_listener(launch.port)
    if not healthy:
        raise VllmProcessError(
            f"port {launch.port} on {VLLM_HOST} is taken by a process this tool did not "
            f"start ({holder}) and it is not a healthy vLLM; it was left alone. Choose "
            "another port"
        )
    if wanted not in served:
        raise VllmProcessError(
            f"port {launch.port} already serves {', '.join(served) or 'no model'} from a vLLM "
            f"this tool did not start ({holder}), not {wanted}; it was left alone. Choose "
            "another port"
        )
    return VllmStatus(
        running=True,
        reachable=True,
        managed_by_us=False,
        reused=True,
        port=launch.port,
        base_url=base_url,
        model=wanted,
        served_models=served,
        data_dir=str(data_dir),
        reason=f"reusing a healthy vLLM this tool did not start ({holder}); vllm_stop will "
        "not stop it",
    )
