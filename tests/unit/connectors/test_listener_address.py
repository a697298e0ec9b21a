"""The squatter check asks about an address and a port: a listener on another address with the
same port (a forwarder on the host's address while ours binds loopback) takes no connection
made to ours, so it is neither ours nor a squatter; a wildcard listener takes them, so it is."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from graph_kvcache_mcp.connectors.processes.identity import (
    describe_listener,
    listener_owner,
    listener_pid,
    listener_user,
    takes_connections_for,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="binds 127.0.0.2, which only Linux routes to lo"
)

LISTEN = (
    "import socket, sys\n"
    "s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()\n"
    "print('ready', flush=True); sys.stdin.read()\n"
)


@contextmanager
def other_process_listening(host: str, port: int) -> Iterator[subprocess.Popen[str]]:
    """A process that is not this one listening on `host`:`port` until the block ends."""
    child = subprocess.Popen(
        [sys.executable, "-c", LISTEN, host, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield child
    finally:
        child.kill()
        child.wait()


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_listener_on_another_address_with_our_port_is_not_a_squatter() -> None:
    port = free_loopback_port()
    with other_process_listening("127.0.0.2", port) as forwarder:
        assert listener_owner(os.getpid(), port) == "none"  # nothing at 127.0.0.1 yet
        with socket.socket() as ours:
            ours.bind(("127.0.0.1", port))
            ours.listen()
            assert listener_owner(os.getpid(), port) == "ours"
            assert listener_owner(os.getpid(), port, host="127.0.0.1") == "ours"
            assert listener_pid(port) == os.getpid()
            # Asked about the forwarder's address, the same port is someone else's.
            assert listener_owner(os.getpid(), port, host="127.0.0.2") == "foreign"
            assert describe_listener(port, host="127.0.0.2").startswith(f"pid {forwarder.pid} (")
            assert listener_user(port, host="127.0.0.1") == "ours"


def test_a_wildcard_listener_on_our_port_is_a_squatter() -> None:
    port = free_loopback_port()
    with other_process_listening("0.0.0.0", port) as squatter:
        assert listener_owner(os.getpid(), port) == "foreign"
        assert listener_pid(port) == squatter.pid


@pytest.mark.parametrize(
    ("bound", "host", "takes"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("10.203.0.11", "127.0.0.1", False),
        ("0.0.0.0", "127.0.0.1", True),
        ("::", "127.0.0.1", True),
        ("::ffff:127.0.0.1", "127.0.0.1", True),
        ("::1", "127.0.0.1", False),
        ("10.203.0.11", "10.203.0.11", True),
        ("127.0.0.1", "localhost", True),  # a name: counted, erring towards "someone is there"
    ],
)
def test_which_bound_address_takes_connections_for_which_host(
    bound: str, host: str, takes: bool
) -> None:
    assert takes_connections_for(bound, host) is takes
