"""A test double for a busy engine: a loopback proxy that holds every PUT before passing it on.

A real engine on this machine answers a block's PUT in about a millisecond, so a stop never
finds saves queued; a busy one (the bench's 1 MiB blocks on a loaded box) does. The proxy
forwards each connection to the real engine unchanged, after holding a PUT for `hold_s`.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.peers import loopback_peer, pipe


@contextmanager
def slow_writes_proxy(engine_port: int, *, hold_s: float) -> Iterator[str]:
    """The proxy's http:// URL; every PUT through it reaches the engine `hold_s` late."""

    def forward(conn: socket.socket, stop: threading.Event) -> None:
        with conn:
            first = conn.recv(65536)
            if first.startswith(b"PUT "):
                stop.wait(hold_s)
            with socket.create_connection(("127.0.0.1", engine_port), timeout=30) as upstream:
                upstream.sendall(first)
                back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
                back.start()
                pipe(conn, upstream)
                back.join(timeout=30)

    with loopback_peer(forward, backlog=64, thread_per_connection=True) as url:
        yield url
