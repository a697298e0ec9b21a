"""The fastest engine reader we could write on these machines: the plain GET loop benchmarks
compare the connector's loads against (`tools/bench_kv_load.py`, `tools/bench_connector.py`).

Raw sockets on N threads, one GET per key, each answer received into a reused buffer with
`recv_into` and counted, nothing parsed or checked. Not a client: it trusts the engine blindly.
The connector's load rate is reported as a share of this loop's rate on 8 threads (the
connector's own lane count), measured on the same blocks in the same run (`load_share_line`).
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

LOOP_LANES = 8
"""The plain GET loop's threads: as many as the connector's lanes (`kv_concurrency`)."""
SHARE_GOAL = 0.8
"""The connector's load rate, as a share of the plain GET loop's, that issue #42 asks for."""


def reference_read(host: str, port: int, token: str, keys: list[str], lanes: int) -> float:
    """Seconds to GET every key on `lanes` raw-socket lanes, into reused buffers, unchecked."""
    return _read_all(host, port, token, keys, lanes)[0]


def get_loop_rate(
    host: str, port: int, token: str, keys: list[str], *, lanes: int = LOOP_LANES, repeats: int = 3
) -> float:
    """Bytes per second of the plain GET loop over `keys` (median of `repeats` runs)."""
    rates = []
    for _ in range(repeats):
        seconds, received = _read_all(host, port, token, keys, lanes)
        rates.append(received / max(seconds, 1e-9))
    return statistics.median(rates)


def load_share_line(what: str, load_rate: float, loop_rate: float) -> str:
    """The line a benchmark prints for CI's log: the load rate as a share of the GET loop's."""
    share = load_rate / max(loop_rate, 1e-9)
    return (
        f"load share [{what}]: {share:.2f} of the plain {LOOP_LANES}-thread GET loop "
        f"({load_rate / 1e9:.2f} vs {loop_rate / 1e9:.2f} GB/s; goal >= {SHARE_GOAL})"
    )


def _read_all(host: str, port: int, token: str, keys: list[str], lanes: int) -> tuple[float, int]:
    """(seconds, bytes received, headers included) to GET every key on `lanes` lanes."""
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
    return time.perf_counter() - began, sum(received)
