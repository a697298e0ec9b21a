"""A hostile neighbour (test double for an attacker; stdlib only, run as `nobody`).

It watches the pids the kernel hands out for an engine whose command line names `marker` (our
data dir's socket path) and takes its port the moment it sees it, before the engine binds:
`listen` mode listens (with SO_REUSEADDR, as the engine binds, so a port just left by a dead
engine is free to it) and records every byte a client sends it (a token would be there);
`bind` mode only binds, without SO_REUSEADDR, so the engine's own bind fails with "Address
already in use". It prints one line per event on stdout:
`ready`, `won` or `lost`, then `got <hex>` for what each connection sent. An empty `marker` takes
the port at once (the port of an engine that has stopped).
"""

from __future__ import annotations

import socket
import sys
import time

STATS_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _last_pid() -> int:
    with open("/proc/loadavg") as handle:
        return int(handle.read().split()[-1])


def _wait_for_engine(marker: bytes, deadline: float) -> bool:
    """Watch the pids the kernel hands out (the last one is in /proc/loadavg, cheap to poll)
    and each new one's command line until one names `marker` (a child shows its parent's
    command line until it execs, so new pids are looked at again until they exit)."""
    seen = _last_pid()
    fresh: set[int] = set()
    while time.monotonic() < deadline:
        latest = _last_pid()
        if latest != seen:
            fresh.update(range(seen + 1, latest + 1) if latest > seen else (latest,))
            seen = latest
        for pid in list(fresh):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    if marker in handle.read():
                        return True
            except OSError:
                fresh.discard(pid)
    return False


def main() -> None:
    port, mode, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
    print("ready", flush=True)
    # An empty marker: take the port now (one a stopped engine left).
    if marker and not _wait_for_engine(marker, time.monotonic() + 120):
        return
    squat = socket.socket()
    if mode == "listen":
        squat.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        squat.bind(("127.0.0.1", port))
        if mode == "listen":
            squat.listen(16)
    except OSError:
        print("lost", flush=True)
        return
    print("won", flush=True)
    if mode != "listen":
        time.sleep(120)
        return
    squat.settimeout(120)
    while True:
        peer, _ = squat.accept()
        peer.settimeout(2)
        try:
            data = peer.recv(65536)
            print(f"got {data.hex()}", flush=True)
            peer.sendall(STATS_REPLY)
        except OSError:
            pass
        finally:
            peer.close()


if __name__ == "__main__":
    main()
