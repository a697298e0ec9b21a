"""The managed vLLM lifecycle: reuse, ownership, a held port, a missing vLLM, a clean stop."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from graph_kvcache_mcp.connectors.processes.identity import group_members, listener_pid, start_ticks
from graph_kvcache_mcp.connectors.processes.ports import free_port, port_in_use
from graph_kvcache_mcp.connectors.vllm.health import probe_server
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.targets import Configured, ManagedHere
from graph_kvcache_mcp.domain.vllm.chat import ChatResult
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.errors import VllmProcessError
from tests.support.vllm import BLOCK_SIZE, RunningVllm, VllmServers, fast_cpu_launch

# A listener this project did not start: a plain socket that accepts nothing.
_HOLDER = (
    "import signal, socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); "
    "s.listen(); print('ready', flush=True); signal.pause()"
)


@pytest.fixture
def held_port() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """A loopback port held by a process of ours that is not vLLM (the test stops it itself)."""
    port = free_port()
    # The `with` closes the stdout pipe: left to the garbage collector it raised a ResourceWarning
    # inside a later test's setup.
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(port)], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
            yield port, holder
        finally:
            holder.kill()
            holder.wait(timeout=10)


def alive(pid: int) -> bool:
    return start_ticks(pid) is not None and Path(f"/proc/{pid}/stat").read_text().split(")")[
        -1
    ].split()[0] not in {"Z", "X"}


def conversation(system: str, question: str) -> list[ChatMessage]:
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=question)]


def test_a_port_held_by_another_process_is_reported_and_never_signalled(
    held_port: tuple[int, subprocess.Popen[str]], tmp_path: Path
) -> None:
    port, holder = held_port
    managed = ManagedVllm(tmp_path)
    with pytest.raises(VllmProcessError) as caught:
        managed.start(VllmLaunch(model="/unused", port=port))
    message = str(caught.value)
    assert f"port {port}" in message and f"pid {holder.pid}" in message
    assert "did not start" in message and "left alone" in message
    status = managed.status(target=ManagedHere("vLLM", tmp_path, f"http://127.0.0.1:{port}/v1"))
    stop = managed.stop()
    assert (status.running, status.managed_by_us, status.reachable) == (True, False, False)
    assert (stop.stopped, stop.how) == (False, "not_running")
    assert holder.poll() is None  # still running: nobody signalled it
    assert listener_pid(port) == holder.pid


def test_an_interpreter_without_vllm_gets_a_clear_install_hint(tmp_path: Path) -> None:
    managed = ManagedVllm(tmp_path, python=sys.executable)  # the main venv has no vLLM
    with pytest.raises(VllmProcessError, match="not importable") as caught:
        managed.start(VllmLaunch(model="/unused", port=free_port()))
    assert "pip install" in str(caught.value) and "GRAPH_KVCACHE_VLLM_PYTHON" in str(caught.value)
    assert managed.running_state() is None


def test_status_without_a_server_says_how_to_start_one(tmp_path: Path) -> None:
    where = ManagedHere("vLLM", tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    status = ManagedVllm(tmp_path).status(target=where)
    assert (status.running, status.reachable) == (False, False)
    assert status.reason is not None and "vllm start" in status.reason


def test_a_configured_vllm_that_does_not_answer_is_named_not_probed_on_loopback(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.2:{port}/v1"  # the same port on 127.0.0.1 is not asked
    status = ManagedVllm(tmp_path).status(target=Configured("vLLM", url))
    assert (status.running, status.reachable, status.managed_by_us) == (False, False, False)
    assert status.base_url == url and status.port == port
    assert status.reason is not None and status.reason.startswith(f"no vLLM answers at {url}: ")


@pytest.mark.vllm
def test_starting_again_reuses_our_running_server_and_starts_nothing(
    vllm_server: RunningVllm,
) -> None:
    members = group_members(vllm_server.pid)
    launch = fast_cpu_launch(vllm_server.model_dir, vllm_server.port)
    status = vllm_server.managed.start(launch)
    assert (status.reused, status.managed_by_us, status.pid) == (True, True, vllm_server.pid)
    assert group_members(vllm_server.pid) == members


@pytest.mark.vllm
def test_our_server_asked_for_another_model_is_refused_not_restarted(
    vllm_server: RunningVllm,
) -> None:
    launch = fast_cpu_launch(vllm_server.model_dir, vllm_server.port, served_model_name="other")
    with pytest.raises(VllmProcessError, match="stop it first"):
        vllm_server.managed.start(launch)
    assert probe_server(vllm_server.base_url)[0]


@pytest.mark.vllm
def test_a_healthy_vllm_we_did_not_start_is_reused_but_never_stopped(
    vllm_server: RunningVllm, tmp_path: Path
) -> None:
    stranger = ManagedVllm(tmp_path)  # another data dir: it did not start the shared server
    launch = fast_cpu_launch(vllm_server.model_dir, vllm_server.port)
    status = stranger.start(launch)
    stop = stranger.stop()
    assert (status.reused, status.managed_by_us, status.pid) == (True, False, None)
    assert status.served_models == [vllm_server.model]
    assert status.reason is not None and "will not stop it" in status.reason
    assert (stop.stopped, stop.how) == (False, "not_running")
    assert probe_server(vllm_server.base_url)[0]


@pytest.mark.vllm
async def test_without_prompt_token_details_hits_come_from_metrics_and_stop_leaves_no_process(
    vllm_private: VllmServers,
) -> None:
    system = " ".join(f"Clause {i}: the prefix must stay byte-identical." for i in range(70))
    with vllm_private.private(prompt_tokens_details=False) as server:
        async with server.client() as client:
            first = await client.chat(conversation(system, "one"), max_tokens=2)
            second = await client.chat(conversation(system, "two"), max_tokens=2)
        async with server.client(metrics_fallback=False) as blind:
            unknown = await blind.chat(conversation(system, "three"), max_tokens=2)
        members = group_members(server.pid)
        result = server.managed.stop()
        with anyio.fail_after(10):
            while True:  # its children exit a moment after the leader
                if not any(alive(pid) for pid in members):
                    break
                await anyio.sleep(0.05)
    assert isinstance(first, ChatResult) and isinstance(second, ChatResult)
    assert isinstance(unknown, ChatResult)
    assert first.trace.cached_tokens_source == "metrics_delta"
    assert first.trace.prefix_cache_hit_tokens == 0
    assert second.trace.cached_tokens_source == "metrics_delta"
    hit = second.trace.prefix_cache_hit_tokens
    assert hit is not None and hit > 0 and hit % BLOCK_SIZE == 0
    assert unknown.trace.cached_tokens_source == "unavailable"
    assert unknown.trace.prefix_cache_hit_tokens is None  # unknown, never 0
    assert unknown.trace.prefix_cache_miss_tokens is None
    assert unknown.trace.note is not None and "--enable-prompt-tokens-details" in unknown.trace.note
    assert len(members) >= 3  # API server, engine core, worker (+ resource tracker)
    assert (result.stopped, result.how, result.leftover_pids) == (True, "terminated", [])
    assert not port_in_use("127.0.0.1", server.port)
    assert server.managed.running_state() is None
