"""One instance's KV event feed: a ZMQ SUB on its live endpoint and a DEALER on its replay one.

`sync()` reads whatever has arrived and folds it into the shared `BlockIndex`. On the first sync
(connect), after a sequence gap and after a reset (the instance restarted and numbers from 0
again) it asks the replay socket for the buffered batches from the first one it lacks; the
reply ends with a batch numbered -1 and an empty payload. A replay that starts later than asked
means vLLM's buffer had already moved on: the history is then marked incomplete.

Sockets are plain (blocking with timeouts) and used from one thread at a time: the service runs
`sync` in a worker thread under its lock. Nothing here raises because a peer is down or silent;
a garbage payload is counted and skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack
import zmq

from graph_kvcache_mcp.domain.fleet.events import BadBatch, EventBatch, decode_batch
from graph_kvcache_mcp.domain.fleet.freshness import SequenceTracker
from graph_kvcache_mcp.domain.fleet.index import BlockIndex

END_SEQ = (1 << 64) - 1  # -1 as the unsigned 8 bytes vLLM sends at the end of a replay
REPLAY_TIMEOUT_S = 3.0
MAX_LIVE_PER_SYNC = 10_000
RCV_HWM = 100_000
HEARTBEAT_IVL_MS = 60_000


class EventFeed:
    """The feed of instance `name`, folded into `index`."""

    def __init__(
        self,
        name: str,
        endpoint: str,
        replay_endpoint: str | None,
        index: BlockIndex,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.index = index
        self.tracker = SequenceTracker()
        self.bad_payloads = 0
        self.undecodable_events = 0
        self.encodings: set[str] = set()
        self.last_replay_error: str | None = None
        self._clock = clock
        self._context = context or zmq.Context.instance()
        self._sub: zmq.Socket[bytes] | None = None
        self._connected_once = False

    def __repr__(self) -> str:
        return f"EventFeed({self.name!r}, {self.endpoint!r})"

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    # --- reading -----------------------------------------------------------------------------

    def sync(self, *, settle_s: float = 0.2, deadline_s: float = 10.0) -> None:
        """Bring the index up to date with the instance: replay what the live feed has not
        brought (on connect: everything buffered), then keep reading the live feed until it has
        been quiet for `settle_s` (events trail a request by an engine step).

        Each replay after the first starts at the last batch applied, which the instance's
        buffer still holds unless it restarted: a different batch under that number, or none,
        is a restart even when the live feed missed the new process's first batches."""
        sub = self._subscribe()
        if not self._connected_once:
            self._connected_once = True
            # a subscription takes effect asynchronously: let it land before replaying, so a
            # batch published meanwhile arrives live rather than falling between the two
            time.sleep(0.1)
            self._replay_from(0)
        else:
            self._replay_from(max(self.tracker.last_seq, 0))
        until = time.monotonic() + deadline_s
        read = 0
        while read < MAX_LIVE_PER_SYNC and time.monotonic() < until:
            if not sub.poll(int(settle_s * 1000)):
                return
            frames = sub.recv_multipart()
            read += 1
            if len(frames) != 3 or len(frames[1]) != 8:
                self.bad_payloads += 1
                continue
            self._take(int.from_bytes(frames[1], "big"), frames[2])

    def _subscribe(self) -> zmq.Socket[bytes]:
        if self._sub is None:
            sub = self._context.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, RCV_HWM)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            # A feed read through the edge is a TCP tunnel that closes when idle past its
            # timeout (an hour): ZMQ heartbeats keep a quiet feed's tunnel in use, and a dead
            # peer noticed.
            sub.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_IVL_MS)
            sub.connect(self.endpoint)
            self._sub = sub
        return self._sub

    def _take(self, seq: int, payload: bytes) -> None:
        batch = self._decode(payload)
        if batch is None:
            self._lost(seq)
            return
        step = self.tracker.classify(seq, batch.ts)
        if step == "duplicate":
            return
        if step == "reset":
            self._restarted()
            self._replay_from(0)  # the new process's buffer holds its whole history
        elif step == "gap":
            self.tracker.gaps += 1
            self._replay_from(self.tracker.last_seq + 1)
        if seq > self.tracker.last_seq:  # the replay may have brought it already
            if seq > self.tracker.last_seq + 1:
                self.tracker.history_complete = False
            self._apply(seq, batch)

    def _apply(self, seq: int, batch: EventBatch) -> None:
        self.index.apply(self.name, batch.events)
        self.encodings.update(batch.encodings)
        self.undecodable_events += batch.undecodable
        self.tracker.applied(seq, batch.ts, self._clock())

    def _decode(self, payload: bytes) -> EventBatch | None:
        try:
            return decode_batch(msgpack.unpackb(payload, raw=False, strict_map_key=False))
        except (BadBatch, ValueError, TypeError, msgpack.UnpackException):
            return None

    def _restarted(self) -> None:
        self.index.forget_instance(self.name)
        self.tracker.restarted()

    def _lost(self, seq: int) -> None:
        """A batch that cannot be read: counted once, its number passed, the history partial."""
        if seq <= self.tracker.last_seq:
            return  # the same batch again (live and replay overlap)
        self.bad_payloads += 1
        self.tracker.last_seq = seq
        self.tracker.history_complete = False

    # --- replay ------------------------------------------------------------------------------

    def _replay_from(self, start: int) -> None:
        """Ask for every buffered batch numbered `start` or later and apply them in order.

        When the answer shows a restart (our last batch missing, or another batch under a number
        we applied) nothing more of it is applied: the index forgets the instance and replays
        the new process's buffer from its first batch."""
        if not self.replay_endpoint:
            return
        self.tracker.replays += 1
        anchor = self.tracker.last_seq if start == self.tracker.last_seq >= 0 else None
        answered = restarted = False
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not dealer.poll(int(REPLAY_TIMEOUT_S * 1000)):
                    self.last_replay_error = (
                        f"no replay answer from {self.replay_endpoint} within {REPLAY_TIMEOUT_S} s"
                    )
                    return
                frames = dealer.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    self.bad_payloads += 1
                    continue
                seq = int.from_bytes(frames[2], "big")
                if seq == END_SEQ:
                    break
                if restarted and start > 0:
                    continue  # drain: the new history is read from its start below
                if anchor is not None and not answered and seq != anchor:
                    restarted = True  # the batch we applied last is not in its buffer
                    continue
                answered = True
                restarted = self._replayed(seq, frames[3], start) or restarted
            if anchor is not None and not answered:
                restarted = True  # an empty buffer where our last batch should be
            self.tracker.synced = True
            self.last_replay_error = None
        finally:
            dealer.close(linger=0)
        if restarted and start > 0:
            self._restarted()
            self._replay_from(0)

    def _replayed(self, seq: int, payload: bytes, start: int) -> bool:
        """Apply one replayed batch; True when it shows the instance restarted."""
        batch = self._decode(payload)
        if batch is None:
            self._lost(seq)
            return False
        step = self.tracker.classify(seq, batch.ts)
        if step == "duplicate":
            return False
        if step == "reset":
            if start > 0:
                return True  # applied by the replay from 0 that follows
            self._restarted()
        if seq > self.tracker.last_seq + 1:  # vLLM's buffer had moved past what we lack
            self.tracker.history_complete = False
        self._apply(seq, batch)
        return step == "reset"
