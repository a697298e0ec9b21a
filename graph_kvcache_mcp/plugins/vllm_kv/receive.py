"""Loading stored KV blocks into vLLM's paged cache at the speed of the wire.

One load (`BlockLoader.load`, or `fetch_runs` for several runs in one batch) GETs its blocks on
the engine client's lanes. For each, a `BlockReceiver` is the wire's body sink
(`http_response.BodySink`): the value's small header goes into its own bytes and is checked
first; then, where the block's pages are host memory (`PagesOf`: vLLM's CPU cache), the payload
is received straight into them, page by page (`socket.recv_into`: the only copy, from the
kernel), checksummed as it arrives. Elsewhere it goes into a one-block slot and, complete and
intact, is copied into the block (`WriteBlock`) by the lane that received it. The checksum and
the copy release the GIL for such sizes, so lanes overlap. Memory: one slot per lane, reused.

Lanes write into the KV cache only while their load is open (a `WriteWindow`, as in the LMCache
adapter): a receiver holds the window from its block's first payload byte until the block is
complete or its exchange ended (`BodySink.ended`: a timeout or reset), and a slot copy holds it
while it copies; the load closes it before it returns to vLLM, waiting for those, so a lane that
answers after the deadline never touches a block vLLM may already recompute or reuse. A block
received in place whose checksum fails holds garbage: it is reported as not loaded, and vLLM
recomputes it (as it does every block after the first that failed).
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
    """Receives the value stored under `key`, checks it, and puts its payload in its block:
    into `pages` as it arrives when given (holding the load's `window` meanwhile), else through
    a slot and `deliver`."""

    def __init__(
        self,
        key: str,
        identity: KvModelIdentity,
        slots: SlotPool,
        deliver: Deliver,
        *,
        window: WriteWindow,
        pages: Sequence[memoryview] | None = None,
    ) -> None:
        self.key = key
        self.identity = identity
        self._slots = slots
        self._deliver = deliver
        self._pages = pages
        self._window = window
        self._entered = False  # holds the window: receiving into the block's pages
        self._page = 0
        self._page_filled = 0
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
        if self._pages is not None:
            if not self._entered:
                if not self._window.enter():
                    self._finish(LATE)
                    return self._scratch_view()
                self._entered = True
            return self._pages[self._page][self._page_filled :]
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
        assert self._check is not None
        if self._pages is not None:
            page = self._pages[self._page]
            self._check.update(page[self._page_filled : self._page_filled + count])
            self._page_filled += count
            if self._page_filled == len(page):
                self._page, self._page_filled = self._page + 1, 0
        else:
            assert self._slot is not None
            self._check.update(self._slot[self._payload_filled : self._payload_filled + count])
        self._payload_filled += count
        if self._payload_filled == self.identity.block_bytes:
            self._complete()

    def ended(self) -> None:
        self._leave()

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
        if self._pages is None:
            self._slot = self._slots.take()

    def _complete(self) -> None:
        """The whole payload is in (its length matched the header): check it, and deliver it
        unless it is in its pages already."""
        assert self._check is not None
        intact = self._check.matches()
        if self._pages is not None:
            self._leave()
            self._finish(None if intact else CHECKSUM_MISMATCH)
            return
        assert self._slot is not None
        outcome = self._deliver(self._slot) if intact else CHECKSUM_MISMATCH
        self._slots.give(self._slot)
        self._slot = None
        self._finish(outcome)

    def _leave(self) -> None:
        if self._entered:
            self._entered = False
            self._window.leave()

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
PagesOf = Callable[[int], Sequence[memoryview] | None]
"""Writable views of a block's pages in the KV cache, in payload order
(`PagedKvCache.block_pages`); None where they are not host memory."""


class BlockLoader:
    """Loads runs of stored blocks into one worker's KV cache: into `pages_of` a block's pages
    as they arrive where it gives them, else through a slot and `write_block`."""

    def __init__(
        self,
        store: EngineBlockStore,
        identity: KvModelIdentity,
        write_block: WriteBlock,
        pages_of: PagesOf | None = None,
        *,
        slots: SlotPool | None = None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        """`slots` receive the blocks (default: plain memory; a CUDA cache's are pinned);
        `settle` waits for copies `write_block` only queued (`WriteWindow`)."""
        self.store = store
        self.identity = identity
        self.write_block = write_block
        self.pages_of = pages_of
        self._slots = slots or SlotPool(identity.block_bytes)
        self.settle = settle

    def load(self, keys: Sequence[str], block_ids: Sequence[int]) -> LoadResult:
        """Put the blocks stored under `keys` into `block_ids`; the leading intact run counts.

        Blocks after the first that failed may have been written too; the caller reports them
        for recompute, which overwrites them. Never raises for what the engine sends.
        """
        return fetch_runs(self.store, [(self, keys, block_ids)])[0]

    def receivers(
        self, keys: Sequence[str], block_ids: Sequence[int], window: WriteWindow
    ) -> list[BlockReceiver]:
        return [
            BlockReceiver(
                key,
                self.identity,
                self._slots,
                self._deliverer(window, block_id),
                pages=None if self.pages_of is None else self.pages_of(block_id),
                window=window,
            )
            for key, block_id in zip(keys, block_ids, strict=True)
        ]

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


Run = tuple[BlockLoader, Sequence[str], Sequence[int]]
"""A loader, the keys to load and the blocks they go into."""


def fetch_runs(store: EngineBlockStore, runs: Sequence[Run]) -> list[LoadResult]:
    """Load several runs in one batch on the client's lanes (a hybrid's attention blocks and its
    Mamba state arrive together, not one after the other); one result per run."""
    settles = [loader.settle for loader, _, _ in runs if loader.settle is not None]
    window = WriteWindow(_all_of(settles) if settles else None)
    per_run = [loader.receivers(keys, ids, window) for loader, keys, ids in runs]
    receivers = [receiver for run in per_run for receiver in run]
    expect = sum(len(keys) * loader.identity.block_bytes for loader, keys, _ in runs)
    try:
        answers = store.fetch_into(
            [receiver.key for receiver in receivers], receivers, expect_bytes=expect
        )
    finally:
        window.close()
    results, at = [], 0
    for run in per_run:
        results.append(_leading_run(run, answers[at : at + len(run)]))
        at += len(run)
    return results


def _all_of(settles: Sequence[Callable[[], None]]) -> Callable[[], None]:
    def settle_all() -> None:
        for settle in settles:
            settle()

    return settle_all


def _leading_run(receivers: Sequence[BlockReceiver], answers: Sequence[object]) -> LoadResult:
    loaded = read_bytes = 0
    for receiver, answer in zip(receivers, answers, strict=True):
        why = receiver.verdict() if isinstance(answer, Hit) else _missing(answer)
        if why is not None:
            return LoadResult(loaded, read_bytes, (receiver.key, why.reason))
        loaded += 1
        read_bytes += answer.value if isinstance(answer, Hit) else 0
    return LoadResult(loaded, read_bytes)


def _missing(answer: object) -> RejectedBlock:
    if isinstance(answer, Unavailable):
        return RejectedBlock(f"engine unavailable: {answer.reason}")
    return RejectedBlock("not in the engine")
