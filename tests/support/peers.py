"""Test doubles for what a real engine cannot be made to do: answer garbage, or stall.

`garbage_peer` and `slow_peer` are plain loopback TCP servers in a thread, named for what they are.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def _peer(reply: bytes | None, *, hold_s: float = 0.0) -> Iterator[str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    conn.recv(65536)
                    if reply is not None:
                        conn.sendall(reply)
                    stop.wait(hold_s)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


@contextmanager
def garbage_peer(reply: bytes = b"\x00\xffnot http at all\r\n\r\n") -> Iterator[str]:
    """Answers every request with `reply` and closes."""
    with _peer(reply) as url:
        yield url


@contextmanager
def slow_peer(hold_s: float = 3.0) -> Iterator[str]:
    """Accepts, reads the request, and says nothing for `hold_s` seconds."""
    with _peer(None, hold_s=hold_s) as url:
        yield url
