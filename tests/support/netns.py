"""Network namespaces standing in for hosts: two of them joined by a veth pair (`two_hosts`), or
any number on one bridge in the root namespace (`hosts_on_bridge`: the bridge is where a capture
listens), with addresses only inside them (the root namespace gets no address and no route),
removed in a finalizer.

Needs root and `ip` (CI runs as root); `require_netns` skips with the reason otherwise (and
`tools/bench_edge.py --netns` refuses with it). Programs run inside a namespace with `ip netns
exec`: our CLI started there (`Host.cli`) starts its children there, so the engine and the edges
of a "host" see that host's loopback and address only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.engines import require_in_ci

COMMAND_TIMEOUT_S = 60.0
CLI = (sys.executable, "-m", "graph_kvcache_mcp")


# Run inside a host: whether a TCP connection to each HOST:PORT opens ("open" or "closed").
_CONNECT = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        print("open")
    except OSError:
        print("closed")
"""


@dataclass(frozen=True)
class Host:
    """One namespace: its name and its address on the link."""

    namespace: str
    address: str

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        check: bool = True,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside this host's namespace; its output as text."""
        return subprocess.run(
            ["ip", "netns", "exec", self.namespace, *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=check,
        )

    def cli(self, *args: object, env: dict[str, str] | None = None) -> dict[str, object]:
        """Run our CLI with `args` and `--json` inside this host; its JSON answer (it must
        succeed)."""
        done = self.run([*CLI, *(str(a) for a in args), "--json"], env=env, check=False)
        assert done.returncode == 0, done.stderr + done.stdout
        result: dict[str, object] = json.loads(done.stdout)
        return result

    def connects(self, targets: Sequence[str]) -> list[bool]:
        """Whether a TCP connection from this host to each HOST:PORT of `targets` opens."""
        done = self.run([sys.executable, "-c", _CONNECT, *targets])
        said = done.stdout.split()
        assert len(said) == len(targets), done.stdout + done.stderr
        return [word == "open" for word in said]

    def spawn(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Start `argv` inside this host's namespace in the background; its output as text."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )


def processes_left(host: Host, *, bound_s: float = 30.0) -> list[str]:
    """The pids still in `host`'s namespace, once none is left or `bound_s` passed (a stop's
    last exits may take a moment: a bound, not a race)."""
    deadline = time.monotonic() + bound_s
    while True:
        left = subprocess.run(
            ["ip", "netns", "pids", host.namespace], capture_output=True, text=True, check=False
        ).stdout.split()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip`"
    return None


def require_netns() -> None:
    """Skip locally, saying why, when namespaces cannot be made; fail in CI, which runs as root
    with `ip` installed (`.ci/run`), so a missing piece is never a silent skip there."""
    if (reason := netns_unavailable()) is not None:
        require_in_ci(f"network namespaces ({reason})")


@contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Two namespaces on one /24 of their own (10.254.N.1 and .2), torn down on exit."""
    tag = secrets.token_hex(3)
    net = f"10.254.{int(tag[:2], 16)}"
    store = Host(f"gkm-{tag}-store", f"{net}.1")
    node = Host(f"gkm-{tag}-node", f"{net}.2")
    made: list[str] = []
    try:
        for host in (store, node):
            _ip("netns", "add", host.namespace)
            made.append(host.namespace)
        _ip("link", "add", f"gkm{tag}s", "type", "veth", "peer", "name", f"gkm{tag}n")
        for host, link in ((store, f"gkm{tag}s"), (node, f"gkm{tag}n")):
            _ip("link", "set", link, "netns", host.namespace)
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", link)
            _ip("-n", host.namespace, "link", "set", link, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        yield store, node
    finally:
        for namespace in made:  # deleting a namespace deletes its end of the veth pair too
            subprocess.run(["ip", "netns", "del", namespace], check=False, timeout=30)


@dataclass(frozen=True)
class BridgedHosts:
    """Hosts on one bridge: the bridge's name in the root namespace (it has no address: what
    crosses between the hosts passes it, so a capture on it sees every byte between them)."""

    bridge: str
    hosts: tuple[Host, ...]


@contextmanager
def hosts_on_bridge(*names: str) -> Iterator[BridgedHosts]:
    """One namespace per name on one /24 of their own (10.253.N.1, .2, ... in the order given),
    each joined to a bridge in the root namespace by a veth pair; all torn down on exit."""
    tag = secrets.token_hex(3)
    net = f"10.253.{int(tag[:2], 16)}"
    bridge = f"gkb{tag}"
    hosts = tuple(
        Host(f"gkm-{tag}-{name}", f"{net}.{index}") for index, name in enumerate(names, start=1)
    )
    made: list[str] = []
    bridged = False
    try:
        _ip("link", "add", bridge, "type", "bridge")
        bridged = True
        _ip("link", "set", bridge, "up")
        for index, host in enumerate(hosts, start=1):
            _ip("netns", "add", host.namespace)
            made.append(host.namespace)
            outside, inside = f"gk{tag}{index}b", f"gk{tag}{index}h"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("link", "set", inside, "netns", host.namespace)
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inside)
            _ip("-n", host.namespace, "link", "set", inside, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        yield BridgedHosts(bridge, hosts)
    finally:
        for namespace in made:  # deleting a namespace deletes its veth pair too
            subprocess.run(["ip", "netns", "del", namespace], check=False, timeout=30)
        if bridged:
            subprocess.run(["ip", "link", "del", bridge], check=False, timeout=30)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)
