"""Process identity through psutil: the start time state files record, liveness, and refusals
where a platform lacks what a check needs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.processes.identity import (
    describe_listener,
    group_members,
    is_alive,
    listener_owner,
    listener_pid,
    start_ticks,
)
from graph_kvcache_mcp.errors import ProcessError


def test_this_process_is_alive_under_its_own_start_time() -> None:
    ticks = start_ticks(os.getpid())
    assert ticks is not None and is_alive(os.getpid(), ticks)
    assert not is_alive(os.getpid(), ticks + 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with Linux's /proc")
def test_on_linux_the_start_time_is_the_kernels_tick_count_state_files_always_held() -> None:
    for pid in (1, os.getpid(), os.getppid()):
        stat = Path(f"/proc/{pid}/stat").read_text()
        assert start_ticks(pid) == int(stat.rsplit(")", 1)[1].split()[19])


def test_a_process_that_exited_has_no_start_time_and_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = start_ticks(child.pid)
    child.wait()
    assert start_ticks(child.pid) is None
    assert ticks is not None and not is_alive(child.pid, ticks)


def test_the_listener_of_a_port_is_this_process_and_no_one_elses() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert listener_owner(os.getpid(), port) == "ours"
        assert listener_owner(os.getppid(), port) == "foreign"
        assert listener_pid(port) == os.getpid()
        assert describe_listener(port).startswith(f"pid {os.getpid()} (")
    assert listener_owner(os.getpid(), port) == "none"
    assert describe_listener(port) == "owner unknown"


def test_with_a_host_only_the_listeners_that_take_its_connections_count() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.2", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert listener_owner(os.getppid(), port, host="127.0.0.1") == "none"  # another address
        assert listener_owner(os.getppid(), port, host="127.0.0.2") == "foreign"
        assert listener_owner(os.getpid(), port, host="127.0.0.2") == "ours"
    with socket.socket() as wildcard:
        wildcard.bind(("0.0.0.0", 0))
        wildcard.listen()
        port = wildcard.getsockname()[1]
        assert listener_owner(os.getppid(), port, host="127.0.0.1") == "foreign"  # takes it too


def test_without_process_groups_a_group_lookup_refuses_instead_of_finding_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert os.getpid() in group_members(os.getpgid(0))
    monkeypatch.delattr(os, "getpgid")  # as on Windows
    with pytest.raises(ProcessError, match="process groups"):
        group_members(1)


def test_a_listening_socket_shared_with_a_child_still_counts_as_ours() -> None:
    """psutil names one holder per socket; a child that inherited ours must not make it foreign
    (the engine's own short-lived forks did, before sockets were matched per process)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(30)"], pass_fds=[listening.fileno()]
        )
        try:
            assert listener_owner(os.getpid(), port) == "ours"
            assert listener_owner(child.pid, port) == "ours"
        finally:
            child.kill()
            child.wait()
