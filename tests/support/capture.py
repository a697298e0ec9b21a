"""A packet capture on a link of the root namespace (an `AF_PACKET` raw socket, promiscuous, so a
bridge hands it the frames it forwards between its ports, not only those addressed to it): what
crossed between the hosts, to search for what must never cross in clear. Needs root."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.support.netns import Host

_ETH_P_ALL = 0x0003
_SOL_PACKET = 263
_PACKET_ADD_MEMBERSHIP = 1
_PACKET_MR_PROMISC = 1


@dataclass
class Capture:
    """The frames seen so far, whole (Ethernet headers included), in arrival order."""

    frames: list[bytes] = field(default_factory=list)

    @property
    def data(self) -> bytes:
        return b"".join(self.frames)

    def holds(self, needle: bytes) -> bool:
        """Whether `needle` appears in a frame, or across two frames back to back (a string a
        TCP segment boundary split)."""
        return any(needle in frame for frame in self.frames) or needle in self.data


@contextmanager
def capture_on(link: str) -> Iterator[Capture]:
    """Capture every frame on `link` (a device of the root namespace) while the block runs."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
    sock.bind((link, 0))
    membership = struct.pack("iHH8s", socket.if_nametoindex(link), _PACKET_MR_PROMISC, 0, b"")
    sock.setsockopt(_SOL_PACKET, _PACKET_ADD_MEMBERSHIP, membership)
    sock.settimeout(0.2)
    seen = Capture()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                seen.frames.append(sock.recv(65536))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        stop.set()
        reader.join(timeout=5)
        sock.close()


# A canary in clear between two namespaces: what proves a capture sees what crosses.
_CANARY_SERVER = """
import socket, sys
with socket.create_server((sys.argv[1], int(sys.argv[2]))) as server:
    print("ready", flush=True)
    connection, _ = server.accept()
    print(connection.recv(100).decode(), flush=True)
"""
_CANARY_CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as connection:
    connection.sendall(sys.argv[3].encode())
"""
CANARY_PORT = 7999


def send_canary(sender: Host, receiver: Host) -> str:
    """Send a fresh canary string in clear over TCP from `sender` to `receiver`; the string
    (a capture between them must hold it, or it saw nothing)."""
    canary = "CANARY" + os.urandom(6).hex()
    port = str(CANARY_PORT)
    server = receiver.spawn([sys.executable, "-c", _CANARY_SERVER, receiver.address, port])
    assert server.stdout is not None and server.stdout.readline() == "ready\n"
    sender.run([sys.executable, "-c", _CANARY_CLIENT, receiver.address, port, canary])
    assert server.communicate(timeout=30)[0].strip() == canary
    return canary
