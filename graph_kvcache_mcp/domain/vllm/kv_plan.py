"""Which KV blocks to load from the engine and which to save, step by step. Pure: no I/O, no vLLM.

The vLLM connector's scheduler side feeds this planner what vLLM's scheduler tells it (lookups,
allocations, each step's scheduled requests) and ships the resulting `StepPlan` to the workers.

Rules it keeps (each learnt from vLLM 0.32's scheduler):
- A lookup covers whole blocks only, and never the prompt's last token (a synchronous load of
  every token leaves nothing to compute, which vLLM's scheduler asserts against).
- Blocks are saved as they become full, step by step: with chunked prefill a request's first step
  covers only its first chunk.
- A preempted request loses its blocks; it comes back with a new block list and is looked up
  again. Blocks already saved are not saved twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from graph_kvcache_mcp.domain.vllm.kv_blocks import KEY_PREFIX, block_digests, chain_root


@dataclass(frozen=True, slots=True)
class BlockTransfer:
    """Blocks of one request to move: `keys[i]` belongs in KV cache block `block_ids[i]`."""

    req_id: str
    block_ids: list[int]
    keys: list[str]


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the workers do in one step: load before the forward pass, save after it."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request in a step, as vLLM's scheduler output describes it."""

    req_id: str
    num_computed_tokens: int
    num_scheduled_tokens: int
    new_block_ids: list[int] | None = None
    replaces_blocks: bool = False
    """True for a new or resumed request: `new_block_ids` is its whole block list."""


@dataclass
class _Tracked:
    tokens: Sequence[int]
    root: bytes
    digests: list[bytes] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    saved_blocks: int = 0
    lookup_start: int = 0
    pending_load: BlockTransfer | None = None


class TransferPlanner:
    """Per-request bookkeeping for one vLLM scheduler (not thread-safe; vLLM calls it from one)."""

    def __init__(self, identity_digest: str, block_size: int) -> None:
        self.identity_digest = identity_digest
        self.block_size = block_size
        self._requests: dict[str, _Tracked] = {}

    def lookup_keys(
        self, req_id: str, tokens: Sequence[int], local_tokens: int, cache_salt: str | None
    ) -> list[str]:
        """Keys to look for in the engine, in order, after `local_tokens` already cached locally.

        `tokens` is the request's live token list (prompt, then output after a preemption); the
        planner keeps the reference to name the blocks it saves later.
        """
        tracked = self._track(req_id, tokens, cache_salt)
        start = local_tokens // self.block_size
        stop = max(0, (len(tokens) - 1) // self.block_size)  # never the last token
        tracked.lookup_start = start
        return self._keys(tracked, start, stop)

    def admitted(
        self, req_id: str, block_ids: Sequence[int], external_tokens: int, local_tokens: int
    ) -> None:
        """vLLM allocated the request's blocks and accepted `external_tokens` from the engine."""
        tracked = self._requests.get(req_id)
        if tracked is None:
            return
        first = local_tokens // self.block_size
        count = external_tokens // self.block_size
        tracked.saved_blocks = max(tracked.saved_blocks, first + count)
        if count <= 0:
            tracked.pending_load = None
            return
        keys = self._keys(tracked, first, first + count)
        tracked.pending_load = BlockTransfer(req_id, list(block_ids[first : first + count]), keys)

    def plan_step(
        self,
        scheduled: Sequence[ScheduledRequest],
        *,
        preempted: Sequence[str] = (),
        finished: Sequence[str] = (),
    ) -> StepPlan:
        """Loads and saves for this step; clears the pending loads it hands out."""
        for req_id in preempted:
            if (tracked := self._requests.get(req_id)) is not None:
                tracked.block_ids = []  # freed by vLLM; the resumed request brings new ones
        plan = StepPlan()
        for request in scheduled:
            tracked = self._requests.get(request.req_id)
            if tracked is None:
                continue
            if request.new_block_ids is not None:
                if request.replaces_blocks:
                    tracked.block_ids = list(request.new_block_ids)
                else:
                    tracked.block_ids.extend(request.new_block_ids)
            if tracked.pending_load is not None:
                plan.loads.append(tracked.pending_load)
                tracked.pending_load = None
            if (save := self._save_for(tracked, request)) is not None:
                plan.saves.append(save)
        for req_id in finished:
            self._requests.pop(req_id, None)
        return plan

    def forget(self, req_id: str) -> None:
        """The request finished or was aborted."""
        self._requests.pop(req_id, None)

    def take_pending_load(self, req_id: str) -> BlockTransfer | None:
        """The load `admitted` planned for `req_id`, handed out once (hybrids load it at once,
        before the request is scheduled; dense plans hand it out with the step)."""
        tracked = self._requests.get(req_id)
        if tracked is None:
            return None
        load, tracked.pending_load = tracked.pending_load, None
        return load

    def chain_digest(self, req_id: str, block_index: int) -> bytes | None:
        """The chained digest of block `block_index` of a tracked request (it names the prefix
        up to that block's end), or None when the request is not tracked or that short."""
        tracked = self._requests.get(req_id)
        if tracked is None or block_index < 0:
            return None
        if (block_index + 1) * self.block_size > len(tracked.tokens):
            return None
        self._keys(tracked, block_index, block_index + 1)
        return tracked.digests[block_index]

    @property
    def tracked_requests(self) -> int:
        return len(self._requests)

    # --- internals ---------------------------------------------------------------------------

    def _track(self, req_id: str, tokens: Sequence[int], cache_salt: str | None) -> _Tracked:
        tracked = self._requests.get(req_id)
        if tracked is None or tracked.tokens is not tokens:
            root = chain_root(self.identity_digest, cache_salt)
            tracked = _Tracked(tokens=tokens, root=root)
            self._requests[req_id] = tracked
        return tracked

    def _keys(self, tracked: _Tracked, start: int, stop: int) -> list[str]:
        """Keys of blocks [start, stop), extending the request's digest chain as needed."""
        have = len(tracked.digests)
        if stop > have:
            parent = tracked.digests[-1] if tracked.digests else tracked.root
            tail = tracked.tokens[have * self.block_size : stop * self.block_size]
            tracked.digests.extend(block_digests(parent, tail, self.block_size))
        return [KEY_PREFIX + digest.hex() for digest in tracked.digests[start:stop]]

    def _save_for(self, tracked: _Tracked, request: ScheduledRequest) -> BlockTransfer | None:
        computed = request.num_computed_tokens + request.num_scheduled_tokens
        full = min(computed, len(tracked.tokens), len(tracked.block_ids) * self.block_size)
        full_blocks = full // self.block_size
        if full_blocks <= tracked.saved_blocks:
            return None
        start, tracked.saved_blocks = tracked.saved_blocks, full_blocks
        return BlockTransfer(
            request.req_id,
            tracked.block_ids[start:full_blocks],
            self._keys(tracked, start, full_blocks),
        )
