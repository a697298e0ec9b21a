"""A hostile neighbour (test double for an attacker; stdlib only, run as `nobody`).

It watches /proc for an engine whose command line names `marker` (our data dir's socket path)
and takes its port the moment it sees it, before the engine binds: `listen` mode listens and
records every byte a client sends it (a token would be there), `bind` mode only binds, so the
engine's own bind fails with "Address already in use". It prints one line per event on stdout:
`ready`, `won` or `lost`, then `got <hex>` for what each connection sent.
"""

from __future__ import annotations

import os
import socket
import sys
import time

STATS_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _engine_seen(marker: bytes, before: set[str]) -> bool:
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry in before:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if marker in handle.read():
                    return True
        except OSError:
            continue
    return False


def main() -> None:
    port, mode, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
    before = {entry for entry in os.listdir("/proc") if entry.isdigit()}
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    while not _engine_seen(marker, before):
        if time.monotonic() > deadline:
            return
    squat = socket.socket()
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
