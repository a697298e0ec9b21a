"""Loading stored KV blocks into vLLM's paged cache at the speed of the wire.

One load (`BlockLoader.load`) GETs its blocks on the engine client's lanes. For each, a
`BlockReceiver` is the wire's body sink (`http_response.BodySink`): the value's small header goes
into its own bytes and is checked first, the payload straight into a one-block slot
(`socket.recv_into`: one copy, from the kernel), checksummed chunk by chunk as it arrives. The
moment a block is complete and intact, the same lane copies it into the block's page of every
layer (the second and last copy) while the other lanes are still receiving. zlib, hashlib and
the cache copy (numpy) release the GIL for such sizes, so lanes overlap. Memory: one slot per
lane, reused.

Lanes write into the KV cache only while their load is open (a `WriteWindow`, as in the LMCache
adapter): the load closes it before it returns to vLLM, waiting for copies under way, so a lane
that answers after the deadline never touches a block vLLM may already recompute or reuse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graph_kvcache_mcp.connectors.engine.buffer_sink import SlotPool, WriteWindow
from graph_kvcache_mcp.domain.outcomes import Hit, Unavailable
from graph_kvcache_mcp.domain.vllm.kv_blocks import (
    BLOCK_PREFIX_BYTES,
    CHECKSUM_MISMATCH,
    KvModelIdentity,
    PayloadCheck,
    RejectedBlock,
    check_header,
    header_length,
)
from graph_kvcache_mcp.plugins.vllm_kv.store import EngineBlockStore

_SCRATCH_BYTES = 64 * 1024
LATE = RejectedBlock("arrived after the load had ended")

Deliver = Callable[[memoryview], RejectedBlock | None]
"""Copies a checked payload into its block; why not, when it could not (the load had ended)."""


class BlockReceiver:
    """Receives the value stored under `key`, checks it, and delivers its payload."""

    def __init__(
        self, key: str, identity: KvModelIdentity, slots: SlotPool, deliver: Deliver
    ) -> None:
        self.key = key
        self.identity = identity
        self._slots = slots
        self._deliver = deliver
        self._slot: memoryview | None = None
        self._prefix = bytearray(BLOCK_PREFIX_BYTES)
        self._header = bytearray()
        self._head_filled = 0  # bytes of prefix, then header, received
        self._payload_filled = 0
        self._length = 0
        self._received = 0
        self._check: PayloadCheck | None = None
        self._outcome: RejectedBlock | None = None
        self._done = False
        self._scratch: memoryview | None = None

    # --- BodySink ----------------------------------------------------------------------------

    def begin(self, length: int) -> None:
        self._length = length
        if length < BLOCK_PREFIX_BYTES + self.identity.block_bytes:
            self._finish(RejectedBlock(f"value of {length} bytes cannot hold a block"))

    def target(self) -> memoryview:
        if self._done:
            return self._scratch_view()
        if self._head_filled < BLOCK_PREFIX_BYTES:
            return memoryview(self._prefix)[self._head_filled :]
        if (at := self._head_filled - BLOCK_PREFIX_BYTES) < len(self._header):
            return memoryview(self._header)[at:]
        assert self._slot is not None
        return self._slot[self._payload_filled :]

    def wrote(self, count: int) -> None:
        self._received += count
        if self._done:
            return
        if self._head_filled < BLOCK_PREFIX_BYTES + len(self._header):
            self._head_filled += count
            if self._head_filled == BLOCK_PREFIX_BYTES:
                self._sized_header()
            elif self._head_filled == BLOCK_PREFIX_BYTES + len(self._header):
                self._headed()
            return
        assert self._slot is not None and self._check is not None
        self._check.update(self._slot[self._payload_filled : self._payload_filled + count])
        self._payload_filled += count
        if self._payload_filled == self.identity.block_bytes:
            self._complete()

    # --- result ------------------------------------------------------------------------------

    def verdict(self) -> RejectedBlock | None:
        """None when the block went into the KV cache intact; else why it did not."""
        if not self._done:
            return RejectedBlock(f"value cut short ({self._received} of {self._length} bytes)")
        return self._outcome

    # --- internals ---------------------------------------------------------------------------

    def _sized_header(self) -> None:
        header_len = header_length(self._prefix)
        if isinstance(header_len, RejectedBlock):
            self._finish(header_len)
        elif self._length != BLOCK_PREFIX_BYTES + header_len + self.identity.block_bytes:
            self._finish(
                RejectedBlock(
                    f"value of {self._length} bytes does not hold one block of "
                    f"{self.identity.block_bytes} after a {header_len}-byte header"
                )
            )
        elif header_len == 0:
            self._finish(RejectedBlock("KV block header is not JSON"))
        else:
            self._header = bytearray(header_len)

    def _headed(self) -> None:
        """The header is in: a value for another key or identity goes to scratch, unread."""
        check = check_header(self._header, self.key, self.identity)
        if isinstance(check, RejectedBlock):
            self._finish(check)
            return
        self._check = check
        self._slot = self._slots.take()

    def _complete(self) -> None:
        """The whole payload is in (its length matched the header): check it, deliver it."""
        assert self._slot is not None and self._check is not None
        if not self._check.matches():
            outcome: RejectedBlock | None = CHECKSUM_MISMATCH
        else:
            outcome = self._deliver(self._slot)
        self._slots.give(self._slot)
        self._slot = None
        self._finish(outcome)

    def _finish(self, outcome: RejectedBlock | None) -> None:
        self._outcome = outcome
        self._done = True

    def _scratch_view(self) -> memoryview:
        if self._scratch is None:
            self._scratch = memoryview(bytearray(_SCRATCH_BYTES))
        return self._scratch


@dataclass(frozen=True, slots=True)
class LoadResult:
    loaded_blocks: int
    """The leading run of blocks now in the KV cache."""
    read_bytes: int
    """Engine bytes read for those blocks."""
    failure: tuple[str, str] | None = None
    """The first block that did not load, and why (None when all did)."""


WriteBlock = Callable[[int, memoryview], None]
"""Copies one block's payload into that block of the KV cache (`PagedKvCache.write_block`)."""


class BlockLoader:
    """Loads runs of stored blocks into one worker's KV cache through `write_block`."""

    def __init__(
        self,
        store: EngineBlockStore,
        identity: KvModelIdentity,
        write_block: WriteBlock,
        *,
        slots: SlotPool | None = None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        """`slots` receive the blocks (default: plain memory; a CUDA cache's are pinned);
        `settle` waits for copies `write_block` only queued (`WriteWindow`)."""
        self.store = store
        self.identity = identity
        self.write_block = write_block
        self._slots = slots or SlotPool(identity.block_bytes)
        self._settle = settle

    def load(self, keys: Sequence[str], block_ids: Sequence[int]) -> LoadResult:
        """Put the blocks stored under `keys` into `block_ids`; the leading intact run counts.

        Blocks after the first that failed may have been written too; the caller reports them
        for recompute, which overwrites them. Never raises for what the engine sends.
        """
        window = WriteWindow(self._settle)
        receivers = [
            BlockReceiver(key, self.identity, self._slots, self._deliverer(window, block_id))
            for key, block_id in zip(keys, block_ids, strict=True)
        ]
        try:
            expect = len(keys) * self.identity.block_bytes
            answers = self.store.fetch_into(keys, receivers, expect_bytes=expect)
        finally:
            window.close()
        loaded = read_bytes = 0
        for receiver, answer in zip(receivers, answers, strict=True):
            why = receiver.verdict() if isinstance(answer, Hit) else _missing(answer)
            if why is not None:
                return LoadResult(loaded, read_bytes, (receiver.key, why.reason))
            loaded += 1
            read_bytes += answer.value if isinstance(answer, Hit) else 0
        return LoadResult(loaded, read_bytes)

    def _deliverer(self, window: WriteWindow, block_id: int) -> Deliver:
        def deliver(payload: memoryview) -> RejectedBlock | None:
            if not window.enter():
                return LATE
            try:
                self.write_block(block_id, payload)
            except Exception as exc:  # on a lane: never into the wire or vLLM
                return RejectedBlock(f"could not be written into the KV cache ({exc})")
            finally:
                window.leave()
            return None

        return deliver


def _missing(answer: object) -> RejectedBlock:
    if isinstance(answer, Unavailable):
        return RejectedBlock(f"engine unavailable: {answer.reason}")
    return RejectedBlock("not in the engine")
