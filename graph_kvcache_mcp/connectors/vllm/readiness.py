"""Whether the server on a port is the vLLM we started and healthy, and what status says of it.

A start counts as ready once `GET /health` answers 200 **and** the port's listening socket is
proved to belong to the process group we started (`listener_owner`): a squatter that took the
port first is never sent anything (no API key), and the start fails naming it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx2

from graph_kvcache_mcp.connectors.processes.identity import (
    describe_listener,
    is_ours,
    listener_owner,
)
from graph_kvcache_mcp.connectors.processes.ports import port_in_use
from graph_kvcache_mcp.connectors.processes.shared_memory import SegmentWatch
from graph_kvcache_mcp.connectors.processes.status import running_fields
from graph_kvcache_mcp.connectors.vllm.health import last_log_line, probe_server, vllm_reason
from graph_kvcache_mcp.connectors.vllm.platform import VLLM_HOST
from graph_kvcache_mcp.connectors.vllm.state import VllmState, VllmStatus
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.targets import Configured, Target
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
            owner = listener_owner(state.process.pid, state.port, group=True, host=VLLM_HOST)
            if owner == "foreign":
                # A squatter took the port first: nothing (no API key) is sent there.
                holder = describe_listener(state.port, host=VLLM_HOST)
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
                waiting = f"waiting for vLLM /health ({last_log_line(vllm.log_path)})"
                note_or_abandon(vllm, state, watch.seen, note, now - began, timeout_s, waiting)
                next_note = now + 5.0
            watch.sample()
            time.sleep(0.25)  # poll interval; the deadline above bounds the wait
    vllm.abandon(state, watch.seen)
    raise VllmProcessError(
        f"vLLM was not healthy on port {state.port} within {timeout_s:g} s and was stopped; "
        f"its log says: {vllm_reason(vllm.log_path)} (log: {vllm.log_path})"
    )


def note_or_abandon(
    vllm: ManagedVllm,
    state: VllmState,
    segments: Iterable[str],
    note: WaitProgress,
    elapsed_s: float,
    total_s: float,
    message: str,
) -> None:
    """Report progress on a start; a caller that gives up there (its callback raises, as a
    cancelled MCP task's does) has the vLLM this start spawned stopped first, so nothing it
    started is left running."""
    try:
        note(elapsed_s, total_s, message)
    except BaseException:
        vllm.abandon(state, segments)
        raise


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
    holder = describe_listener(port, host=VLLM_HOST)
    return _not_ours(
        VllmEndpoint.local(VLLM_HOST, port).api_base,
        data_dir,
        held=True,
        answers=f"a server this tool did not start answers on port {port} ({holder})",
        fails=f"port {port} is held by a process this tool did not start ({holder}) and it is "
        "not a healthy vLLM",
    )


def unmanaged_status(target: Target | None, data_dir: Path) -> VllmStatus:
    """Without a vLLM of ours: what answers where `target` points. A configured vLLM is probed
    at its own URL; a managed one's port only on this machine's loopback, where we serve."""
    if isinstance(target, Configured):
        return configured_status(target.url, data_dir)
    port = None if target is None or target.url is None else _port(target.url)
    if port is not None and port_in_use(VLLM_HOST, port):
        return foreign_status(port, data_dir)
    return VllmStatus(
        running=False,
        data_dir=str(data_dir),
        port=port,
        reason=f"no managed vLLM runs for {data_dir}"
        + (f" and nothing listens on port {port}" if port is not None else "")
        + "; start one with vllm_start (CLI: graph-kvcache-mcp vllm start --model PATH)",
    )


def configured_status(base_url: str, data_dir: Path) -> VllmStatus:
    """The status of a vLLM named by URL that runs elsewhere (probed there, never signalled)."""
    return _not_ours(
        base_url,
        data_dir,
        held=False,
        answers=f"a vLLM this data dir did not start answers at {base_url}",
        fails=f"no vLLM answers at {base_url}",
    )


def _not_ours(base_url: str, data_dir: Path, *, held: bool, answers: str, fails: str) -> VllmStatus:
    """A server this data dir did not start, probed at `base_url`. `held`: a process holds its
    port (running even when it is no healthy vLLM); the reason is `answers` when it is one, else
    `fails` and what the probe got."""
    healthy, served, reason = probe_server(base_url)
    return VllmStatus(
        running=held or healthy,
        reachable=healthy,
        managed_by_us=False,
        port=_port(base_url),
        base_url=base_url,
        served_models=served,
        data_dir=str(data_dir),
        reason=answers if healthy else f"{fails}: {reason}",
    )


def _port(base_url: str) -> int:
    return parse_http_url(base_url, what="VLLM_BASE_URL").port


def reuse_foreign(launch: VllmLaunch, wanted: str, data_dir: Path) -> VllmStatus:
    """The healthy vLLM serving `wanted` on `launch.port` that this tool did not start, as a
    status to reuse; anything else on that port is refused, never signalled."""
    base_url = VllmEndpoint.local(VLLM_HOST, launch.port).api_base
    healthy, served, _reason = probe_server(base_url)
    holder = describe_listener(launch.port, host=VLLM_HOST)
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
