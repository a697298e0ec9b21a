"""The fastest engine reader we could write on these machines: the ceiling benchmarks compare
the connector's loads against (`tools/bench_kv_load.py`, `tools/bench_connector.py`).

Raw sockets on N threads, one GET per key, each answer received into a reused buffer with
`recv_into` and counted, nothing parsed or checked. Not a client: it trusts the engine blindly.
"""

from __future__ import annotations

import socket
import threading
import time


def reference_read(host: str, port: int, token: str, keys: list[str], lanes: int) -> float:
    """Seconds to GET every key on `lanes` raw-socket lanes, into reused buffers, unchecked."""
    auth = f"Authorization: Bearer {token}\r\n"
    requests = [f"GET /kv/{key} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode() for key in keys]
    cursor = iter(range(len(keys)))
    lock = threading.Lock()
    received = [0] * lanes

    def lane(number: int) -> None:
        buffer = memoryview(bytearray(4 * 1024 * 1024))
        while True:
            with lock:
                index = next(cursor, None)
            if index is None:
                return
            with socket.create_connection((host, port)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(requests[index])
                while count := sock.recv_into(buffer):
                    received[number] += count

    threads = [threading.Thread(target=lane, args=(n,)) for n in range(lanes)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began
