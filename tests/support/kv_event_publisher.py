"""A stand-in for vLLM's KV event publisher (ZMQ PUB + replay ROUTER), named as such.

It exists for what a real vLLM 0.32 cannot be made to do on demand: publish the older positional
(array) encoding, lose a batch on the live feed, send garbage, or restart its numbering without
a restart. It speaks vLLM's wire exactly as measured (docs: shared reference vllm-kv-events.md):
`[topic, seq as 8 bytes, msgpack [ts, events, rank]]` live; replay answers a DEALER's
`[b"", start]` with `[b"", topic, seq, payload]` per buffered batch, then seq -1 and b"".
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import zmq

END = (-1).to_bytes(8, "big", signed=True)


def block_stored(
    hashes: list[int], parent: int | None, tokens: list[int], *, block_size: int, **extra: Any
) -> dict[str, Any]:
    """A `BlockStored` event in vLLM's map encoding (the shape vLLM 0.32 publishes)."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        **extra,
    }


class StandInPublisher:
    def __init__(self, tmp_dir: str) -> None:
        self.endpoint = f"ipc://{tmp_dir}/pub.sock"
        self.replay_endpoint = f"ipc://{tmp_dir}/replay.sock"
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.bind(self.endpoint)
        self._router = self._context.socket(zmq.ROUTER)
        self._router.bind(self.replay_endpoint)
        self.buffer: list[tuple[int, bytes]] = []
        self._next = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pub.close(linger=0)
        self._router.close(linger=0)
        self._context.term()

    def publish(self, events: list[Any], *, live: bool = True, raw: bytes | None = None) -> int:
        """Buffer one batch (and send it live unless `live` is False: a lost batch)."""
        seq = self._next
        self._next += 1
        payload = raw if raw is not None else msgpack.packb([time.time(), events, 0])
        self.buffer.append((seq, payload))
        if live:
            self._pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
        return seq

    def restart(self) -> None:
        """Numbering and buffer begin again, as in a new vLLM process."""
        self.buffer = []
        self._next = 0

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self._router.poll(50):
                continue
            client, _, start = self._router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    self._router.send_multipart(
                        [client, b"", b"kv", seq.to_bytes(8, "big"), payload]
                    )
            self._router.send_multipart([client, b"", b"", END, b""])
