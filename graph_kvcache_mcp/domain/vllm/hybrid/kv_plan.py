"""Which KV blocks and recurrent states of a hybrid model to load and save. Pure: no I/O, no vLLM.

A hybrid (Mamba2 + attention) in vLLM's align mode has one full-attention KV cache group and one
or more Mamba groups. Attention blocks are handled exactly as a dense model's (`TransferPlanner`,
keys chained from the hybrid's identity). A Mamba group holds no per-token KV: it holds the
recurrent state after a prefix, and vLLM keeps that state only at the block-aligned positions it
hands a connector (`boundary_state_offloads`: where a request's prefill ended). So:

- a save is every newly full attention block, plus the state at each boundary vLLM offers, read
  from the exact blocks it names (one per Mamba group);
- a hit is the longest run of attention blocks whose end also has a stored state: vLLM resumes
  the recurrence from that state, so a run without one is worth nothing;
- a load is asynchronous (vLLM parks the request until it is in): with several KV cache groups
  vLLM cannot recompute single failed blocks, only a whole failed request, which it learns of
  through `failed_recving`. A request whose load failed is not looked up again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from graph_kvcache_mcp.domain.vllm.kv_blocks import state_key
from graph_kvcache_mcp.domain.vllm.kv_plan import BlockTransfer, ScheduledRequest, TransferPlanner


@dataclass(frozen=True, slots=True)
class StateTransfer:
    """A recurrent state of one request: `block_ids[g]` are Mamba group g's blocks that hold it
    (a save reads the one block) or receive it (a load)."""

    req_id: str
    key: str
    block_ids: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class HybridLoad:
    """Everything one request loads: its attention blocks and the state at their end."""

    blocks: BlockTransfer
    state: StateTransfer

    @property
    def req_id(self) -> str:
        return self.blocks.req_id


@dataclass(frozen=True, slots=True)
class HybridStepPlan:
    loads: list[HybridLoad] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
    state_saves: list[StateTransfer] = field(default_factory=list)


BoundaryOffers = Mapping[str, Sequence[tuple[int, int, int]]]
"""vLLM's `boundary_state_offloads`: request -> (KV cache group, block id, boundary tokens)."""


class HybridPlanner:
    """Per-request bookkeeping for one vLLM scheduler serving a hybrid (not thread-safe)."""

    def __init__(
        self,
        identity_digest: str,
        state_identity_digest: str,
        block_size: int,
        *,
        attention_group: int,
        state_groups: Sequence[int],
    ) -> None:
        self.blocks = TransferPlanner(identity_digest, block_size)
        self.state_identity_digest = state_identity_digest
        self.block_size = block_size
        self.attention_group = attention_group
        self.state_groups = tuple(state_groups)
        self._loads: dict[str, HybridLoad] = {}
        self._failed: set[str] = set()

    def lookup_keys(
        self, req_id: str, tokens: Sequence[int], local_tokens: int, cache_salt: str | None
    ) -> list[str]:
        """Attention block keys to look for after `local_tokens` (none after a failed load)."""
        if req_id in self._failed:
            return []
        return self.blocks.lookup_keys(req_id, tokens, local_tokens, cache_salt)

    def state_candidates(self, req_id: str, local_tokens: int, present_blocks: int) -> list[str]:
        """State keys at the end of each run of the `present_blocks` found after `local_tokens`,
        longest run first: the first one stored gives the hit."""
        start = local_tokens // self.block_size
        keys: list[str] = []
        for end in range(start + present_blocks, start, -1):
            digest = self.blocks.chain_digest(req_id, end - 1)
            if digest is not None:
                keys.append(state_key(self.state_identity_digest, digest))
        return keys

    def admitted(
        self,
        req_id: str,
        block_ids: Sequence[Sequence[int]],
        external_tokens: int,
        local_tokens: int,
    ) -> None:
        """vLLM allocated every group's blocks and accepted `external_tokens` from the engine."""
        attention = block_ids[self.attention_group]
        self.blocks.admitted(req_id, attention, external_tokens, local_tokens)
        load = self.blocks.take_pending_load(req_id)
        end = (local_tokens + external_tokens) // self.block_size
        digest = self.blocks.chain_digest(req_id, end - 1)
        if load is None or digest is None:
            return
        # vLLM puts the state of a hit of `end` blocks in block `end - 1` of each Mamba group
        # and copies it into the running block when the request is next scheduled.
        targets = tuple((block_ids[group][end - 1],) for group in self.state_groups)
        state = StateTransfer(req_id, state_key(self.state_identity_digest, digest), targets)
        self._loads[req_id] = HybridLoad(load, state)

    def plan_step(
        self,
        scheduled: Sequence[ScheduledRequest],
        *,
        offers: BoundaryOffers,
        preempted: Sequence[str] = (),
        finished: Sequence[str] = (),
    ) -> HybridStepPlan:
        """This step's loads (admitted since the last step), block saves and state saves.

        `scheduled` carries each request's attention-group block ids.
        """
        state_saves = [
            save for req_id, entries in offers.items() for save in self._states(req_id, entries)
        ]
        blocks = self.blocks.plan_step(scheduled, preempted=preempted, finished=finished)
        loads, self._loads = list(self._loads.values()), {}
        return HybridStepPlan(loads=loads, saves=blocks.saves, state_saves=state_saves)

    def load_failed(self, req_id: str) -> None:
        """The workers could not load `req_id`'s blocks: vLLM recomputes it; never look again."""
        self._failed.add(req_id)

    def forget(self, req_id: str) -> None:
        self.blocks.forget(req_id)
        self._loads.pop(req_id, None)
        self._failed.discard(req_id)

    # --- internals ---------------------------------------------------------------------------

    def _states(self, req_id: str, entries: Sequence[tuple[int, int, int]]) -> list[StateTransfer]:
        """One save per block-aligned boundary that every Mamba group offered a block for."""
        by_boundary: dict[int, dict[int, int]] = {}
        for group, block_id, boundary in entries:
            if group in self.state_groups and boundary > 0 and boundary % self.block_size == 0:
                by_boundary.setdefault(boundary, {})[group] = block_id
        saves: list[StateTransfer] = []
        for boundary, blocks in sorted(by_boundary.items()):
            digest = self.blocks.chain_digest(req_id, boundary // self.block_size - 1)
            if digest is None or len(blocks) != len(self.state_groups):
                continue
            key = state_key(self.state_identity_digest, digest)
            saves.append(StateTransfer(req_id, key, tuple((blocks[g],) for g in self.state_groups)))
        return saves
