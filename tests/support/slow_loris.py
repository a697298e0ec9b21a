"""A slow-loris client (test double for an attacker; stdlib only, run as `nobody`).

Opens `count` connections to a loopback port, sends each an incomplete request head and never
finishes it, then prints `open` and, once the server has closed them all (or `wait_s` passed),
one JSON list: the seconds after which each closed connection was closed by the server.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import sys
import time


def main() -> None:
    port, count, wait_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    started = time.monotonic()
    live: list[socket.socket] = []
    for _ in range(count):
        conn = socket.create_connection(("127.0.0.1", port))
        with contextlib.suppress(OSError):  # a connection closed at once may refuse it
            conn.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        live.append(conn)
    print("open", flush=True)
    closed: list[float] = []
    while live and time.monotonic() - started < wait_s:
        ready, _, _ = select.select(live, [], [], 0.5)
        for conn in ready:
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                closed.append(round(time.monotonic() - started, 3))
                live.remove(conn)
                conn.close()
    print(json.dumps(closed), flush=True)


if __name__ == "__main__":
    main()
