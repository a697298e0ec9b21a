"""Test doubles for what a real engine cannot be made to do: answer garbage, or stall.

`garbage_peer`, `slow_peer`, `hung_peer` and `scripted_peer` are plain loopback TCP servers in a
thread, named for what they are; `loopback_peer` is the server under them, for a test that needs a
double of its own.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

Handler = Callable[[socket.socket, threading.Event], None]
"""Serves one accepted connection and closes it; the event is set when the peer stops."""


@contextmanager
def loopback_peer(
    handle: Handler, *, backlog: int = 16, thread_per_connection: bool = False
) -> Iterator[str]:
    """A loopback TCP server in a thread that hands every connection to `handle` (in the accept
    thread, or one thread each); yields its http:// URL and stops when the block exits."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(backlog)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            if thread_per_connection:
                threading.Thread(target=handle, args=(conn, stop), daemon=True).start()
            else:
                handle(conn, stop)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy `source` into `sink` until `source` ends, then end `sink`'s writing side (one way of a
    forwarding double)."""
    with suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    with suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class Script:
    """The bytes a scripted peer answers with; a test may change `reply` between requests."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply


def _answer_with(script: Script, hold_s: float) -> Handler:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        with conn:
            conn.settimeout(2.0)
            try:
                conn.recv(65536)
                if script.reply is not None:
                    conn.sendall(script.reply)
                stop.wait(hold_s)
            except OSError:
                pass

    return answer


@contextmanager
def _peer(reply: bytes | None, *, hold_s: float = 0.0) -> Iterator[str]:
    with loopback_peer(_answer_with(Script(reply), hold_s)) as url:
        yield url


@contextmanager
def scripted_peer(reply: bytes = b"") -> Iterator[tuple[str, Script]]:
    """Answers every request with exactly `script.reply` and closes: for responses a real engine
    never sends (chunked bodies, 1xx, odd framing); the test may change the reply as it goes."""
    script = Script(reply)
    with loopback_peer(_answer_with(script, 0.0)) as url:
        yield url, script


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


class ConnectionCount:
    """How many connections a peer accepted (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def add(self) -> None:
        with self._lock:
            self._value += 1

    @property
    def value(self) -> int:
        with self._lock:
            return self._value


@contextmanager
def hung_peer() -> Iterator[tuple[str, ConnectionCount]]:
    """Accepts every connection, reads the request and never answers (until the block exits), like
    an engine that is stopped but still listening; counts the connections it accepted."""
    accepted = ConnectionCount()

    def hold(conn: socket.socket, stop: threading.Event) -> None:
        accepted.add()
        with conn:
            conn.settimeout(0.2)
            while not stop.is_set():
                try:
                    if not conn.recv(65536):
                        return
                except TimeoutError:
                    continue
                except OSError:
                    return

    with loopback_peer(hold, thread_per_connection=True) as url:
        yield url, accepted
