"""What a managed CPU vLLM hands to another local user (`nobody`) and what it leaves behind,
staged for real: its KV-event replay socket, its rendezvous file, and its status after a crash."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio

from graph_kvcache_mcp.connectors.processes.identity import group_members
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.targets import ManagedHere
from graph_kvcache_mcp.domain.vllm.chat import ChatResult
from tests.support.engines import require_in_ci
from tests.support.neighbour import as_nobody, as_owner, can_run_as_nobody
from tests.support.vllm import VllmServers

PROJECT_PYTHON = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "python")
"""The project's venv (it has pyzmq), which `nobody` may run: the neighbour speaks ZMQ with it."""


def _ours_in(directory: str, prefix: str) -> set[str]:
    return {name for name in os.listdir(directory) if name.startswith(prefix)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_neighbour_gets_no_prompt_from_the_replay_socket_and_a_stop_leaves_nothing(
    vllm_private: VllmServers,
) -> None:
    if not can_run_as_nobody():
        require_in_ci("root with setpriv and /usr/bin/python3 (a second local user)")
    tmp_before, shm_before = _ours_in("/tmp", "vllm_dist_"), set(os.listdir("/dev/shm"))
    with vllm_private.private(kv_events=True) as server:
        async with server.client() as client:
            answer = await client.chat(
                [ChatMessage(role="user", content="a private prompt " * 40)], max_tokens=2
            )
        replay = server.status.kv_events_replay
        assert replay is not None
        probe = as_nobody("replay", replay, python=PROJECT_PYTHON)
        owner = as_owner("replay", replay, python=PROJECT_PYTHON)
        knock = as_nobody("connect", replay)
        members = group_members(server.pid)
        state = server.managed.running_state()
        stopped = server.managed.stop()
        with anyio.fail_after(15):
            while True:  # its children exit a moment after the leader
                if not any(_alive(pid) for pid in members):
                    break
                await anyio.sleep(0.05)
    assert isinstance(answer, ChatResult)
    # The prompt's token ids stay with their owner: the socket is in a 0700 dir of ours.
    assert probe["frames"] == [], probe
    # ... while its owner (the fleet view) still replays over it: batches, then the end marker.
    assert len(owner["frames"]) >= 2 and owner["frames"][-1][2] == "ff" * 8, owner
    assert not knock["connected"] and "Permission denied" in knock["error"], knock
    assert replay.startswith("ipc://") and _private_parent(replay.removeprefix("ipc://"))
    # The stop leaves no process, no rendezvous file and no shared memory of its own.
    assert stopped.stopped and stopped.leftover_pids == []
    assert state is not None and state.rendezvous, "vLLM named no rendezvous file in its log"
    assert _existing(state.rendezvous) == []
    sockets = Path(replay.removeprefix("ipc://")).parent
    assert _existing([str(sockets / "kv-events.sock"), str(sockets / "kv-replay.sock")]) == []
    # Other users' vLLMs may come and go meanwhile: what is new and names our vLLM (in its log
    # or by one of its pids) is ours.
    log = server.managed.log_path.read_text(errors="replace")
    tags = [str(pid) for pid in members]
    new_tmp = _ours_in("/tmp", "vllm_dist_") - tmp_before
    new_shm = set(os.listdir("/dev/shm")) - shm_before
    assert {name for name in new_tmp if name in log} == set()
    assert {name for name in new_shm if name in log or any(tag in name for tag in tags)} == set()


def _private_parent(path: str) -> bool:
    return Path(path).parent.stat().st_mode & 0o077 == 0


def _existing(paths: list[str]) -> list[str]:
    return [path for path in paths if Path(path).exists()]


def test_status_after_a_crash_names_the_port_vllm_used_and_says_it_crashed(
    vllm_private: VllmServers,
) -> None:
    with vllm_private.private() as server:
        state = server.managed.running_state()
        assert state is not None
        os.killpg(server.pid, signal.SIGKILL)  # a crash: nothing of ours stopped it
        deadline = time.monotonic() + 15
        while _alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        default = ManagedHere("vLLM", server.managed.data_dir, "http://127.0.0.1:8000/v1")
        status = server.managed.status(target=default)  # what a caller with no URL set passes
    assert not status.running
    assert status.port == server.port != 8000
    assert status.reason is not None and "crashed" in status.reason, status.reason
    assert f"port {server.port}" in status.reason
    assert _existing(state.rendezvous) == []
    # Its workers' shared-memory queues and their semaphores (recorded once it was ready; a
    # semaphore under its `sem.mp-*` name, though its maps show it deleted) die with it, not in
    # /dev/shm.
    assert state.shared_memory, "vLLM's workers mapped no shared memory: nothing was checked"
    assert any(name.startswith("sem.mp-") for name in state.shared_memory), state.shared_memory
    assert _existing([f"/dev/shm/{name}" for name in state.shared_memory]) == []


DEV_ROUTES = (
    ("POST", "/collective_rpc"),
    ("POST", "/update_weights"),
    ("POST", "/sleep"),
    ("POST", "/reset_prefix_cache"),
    ("GET", "/server_info"),
)


async def test_a_dev_mode_vllm_refuses_its_dev_routes_to_a_neighbour(
    vllm_private: VllmServers,
) -> None:
    if not can_run_as_nobody():
        require_in_ci("root with setpriv and /usr/bin/python3 (a second local user)")
    with vllm_private.private() as server:  # dev mode, as the suite's vLLMs run
        root = server.base_url.removesuffix("/v1")
        refused = {
            path: as_nobody("http", method, root + path, "{}")["status"]
            for method, path in DEV_ROUTES
        }
        public = as_nobody("http", "GET", root + "/v1/models")
        info = as_owner("http", "GET", root + "/server_info")
        async with server.client() as client:
            reset = await client.reset_prefix_cache()
    assert refused == {path: 403 for _, path in DEV_ROUTES}, refused
    assert public["status"] in (200, 401)  # vLLM answers itself: only its key guards /v1
    assert info["status"] == 200  # the owner still reaches the dev routes ...
    assert not isinstance(reset, Unavailable) and reset.reset and reset.dev_mode  # ... our tool too
