"""The fleet's block index: which instance holds which KV block, keyed by token-chain content.

vLLM's block hashes depend on its hash function, seed and version, so they are kept only as each
instance's private names. A block's key here is a digest of its parent's key and its own token
ids (plus any LoRA name and extra keys, so salted or LoRA blocks never match a plain prompt), so
a prompt is looked up by chunking its token ids: no vLLM hash function is reproduced, and two
instances holding the same tokens meet at the same key whatever their hash settings. An instance
that hashes ahead (vLLM 0.33 with speculative decoding and no KV connector: each block's hash
covers the L tokens after it) keys its blocks with those tokens too, and a prompt is looked up on
it with the same L (`prompt_keys(..., lookahead=L)`), as vLLM itself looks it up.

A hybrid model (mamba + attention) has several KV cache groups. Attention groups hold every full
block of the chain; a mamba group keeps its state only at the positions it announces (where a
request's prefill ended). Both are tracked per instance, and a prompt's hit is the longest prefix
every group can serve: a held attention run ending where every mamba group keeps a state.

Memory is bounded: at most `max_blocks` keys are kept; past it the oldest are forgotten (counted
in `forgotten`, so a short answer can say it may be short). Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graph_kvcache_mcp.domain.fleet.events import (
    CHAIN_KINDS,
    MAMBA_KIND,
    AllCleared,
    BlockHash,
    BlocksRemoved,
    BlocksStored,
    Event,
)

ChainKey = bytes
ROOT: ChainKey = b""
DEFAULT_MAX_BLOCKS = 200_000
UNSPECIFIED_MEDIUM = "unspecified"
MAX_PENDING_STATES = 10_000
"""Mamba state hashes kept per instance until the attention block they name is stored."""


def chain_key(parent: ChainKey, tokens: Sequence[int], extra: Any = None) -> ChainKey:
    """The content key of a block holding `tokens` after the block keyed `parent`."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", tokens).tobytes())
    if extra is not None:
        digest.update(repr(extra).encode())
    return digest.digest()


def prompt_keys(tokens: Sequence[int], block_size: int, *, lookahead: int = 0) -> list[ChainKey]:
    """The content keys of every full block of `tokens`, first block first.

    `lookahead`: the L tokens after each block that the instance's hashes cover. vLLM hashes a
    block only once those L tokens exist, so the last L tokens of a prompt end no block.
    """
    keys: list[ChainKey] = []
    parent = ROOT
    for start in range(0, len(tokens) - lookahead - block_size + 1, block_size):
        end = start + block_size
        ahead = _with_lookahead(None, tuple(tokens[end : end + lookahead])) if lookahead else None
        parent = chain_key(parent, tokens[start:end], ahead)
        keys.append(parent)
    return keys


def cacheable_tokens(prompt_tokens: int, block_size: int) -> int:
    """The most prompt tokens vLLM will take from its prefix cache: whole blocks, and never the
    last prompt token (it must be computed to produce the first output)."""
    return max(prompt_tokens - 1, 0) // block_size * block_size


@dataclass(slots=True)
class Block:
    """One block's content and who holds it."""

    tokens: tuple[int, ...]
    parent: ChainKey
    depth: int
    holders: dict[str, set[str]] = field(default_factory=dict)
    """Instance name → media (GPU, CPU, ...) that hold it."""
    states: dict[str, set[int]] = field(default_factory=dict)
    """Instance name → its mamba groups that keep a state at this block's end (hybrids)."""


@dataclass(slots=True)
class InstanceCounts:
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphans: int = 0
    """Stored blocks whose parent this index never saw (stored before the feed's history)."""
    skipped_groups: int = 0
    """Blocks of a KV cache group this index does not model (a group other than the first
    from a vLLM that names no group kind, or a kind other than attention and mamba)."""
    groups: dict[int, str] = field(default_factory=dict)
    """KV cache group index → kind, as its events name them (empty: a dense model's events)."""
    lookahead: int = 0
    """The tokens after each block its hashes cover, as its last stored event named them."""


@dataclass(frozen=True, slots=True)
class Match:
    """How much of a prompt one instance holds."""

    blocks: int
    tokens: int
    by_medium: dict[str, int]
    """Leading prompt tokens held in each medium (each a consecutive run from the start)."""
    state_blocks: tuple[int, ...] | None = None
    """Hybrids: the prefix lengths, in blocks, within the held run where every mamba group keeps
    a state (the only places a hit can end). None: no mamba group."""

    def usable_tokens(self, block_size: int) -> int:
        """The longest held prefix every KV cache group can serve (before the last-token rule)."""
        if self.state_blocks is None:
            return self.tokens
        return max(self.state_blocks, default=0) * block_size

    def served_tokens(self, prompt_tokens: int, block_size: int) -> int:
        """The cached_tokens vLLM reports for the prompt's next request: the usable prefix cut
        to the whole blocks before the last prompt token (for a hybrid, the longest such prefix
        that ends at a kept state)."""
        limit = cacheable_tokens(prompt_tokens, block_size)
        if self.state_blocks is None:
            return min(self.tokens, limit)
        ends = (b * block_size for b in self.state_blocks)
        return max((end for end in ends if end <= limit), default=0)


class BlockIndex:
    """Every instance's blocks, by content."""

    def __init__(self, *, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[ChainKey, Block] = OrderedDict()
        self._names: dict[str, dict[BlockHash, ChainKey]] = {}
        self._held: dict[str, set[ChainKey]] = {}
        self._stateful: dict[str, set[ChainKey]] = {}
        self._pending: dict[str, list[tuple[int, BlockHash]]] = {}
        self.counts: dict[str, InstanceCounts] = {}
        self.forgotten = 0

    def __repr__(self) -> str:
        return f"BlockIndex(blocks={len(self._blocks)}, instances={sorted(self._held)})"

    def __len__(self) -> int:
        return len(self._blocks)

    # --- updates ----------------------------------------------------------------------------

    def apply(self, instance: str, events: Iterable[Event]) -> None:
        """Fold `instance`'s events into the index, in order."""
        counts = self.counts.setdefault(instance, InstanceCounts())
        for event in events:
            match event:
                case BlocksStored():
                    self._store(instance, event, counts)
                case BlocksRemoved():
                    self._remove(instance, event, counts)
                case AllCleared():
                    self._clear(instance)
                    counts.cleared += 1
        self._resolve_states(instance)

    def forget_instance(self, instance: str) -> None:
        """Drop everything `instance` holds, its KV cache groups too (it restarted)."""
        self._clear(instance)
        if instance in self.counts:
            self.counts[instance].groups.clear()

    def _clear(self, instance: str) -> None:
        for key in self._held.pop(instance, set()):
            block = self._blocks.get(key)
            if block is not None:
                block.holders.pop(instance, None)
        for key in self._stateful.pop(instance, set()):
            block = self._blocks.get(key)
            if block is not None:
                block.states.pop(instance, None)
        self._pending.pop(instance, None)
        self._names.pop(instance, None)

    def _store(self, instance: str, event: BlocksStored, counts: InstanceCounts) -> None:
        kind = event.kv_cache_spec_kind
        if event.group_idx is not None and kind is not None:
            counts.groups[event.group_idx] = kind
        if kind == MAMBA_KIND and event.group_idx is not None:
            # its hash names the attention block at that position, which may come later in the
            # same step: resolved once the batch is applied
            pending = self._pending.setdefault(instance, [])
            pending.extend((event.group_idx, name) for name in event.block_hashes)
            return
        # a vLLM that names no kind: its first group only, as a dense model's
        chain = kind in CHAIN_KINDS or (kind is None and event.group_idx in (None, 0))
        if not chain:
            counts.skipped_groups += len(event.block_hashes)
            return
        names = self._names.setdefault(instance, {})
        held = self._held.setdefault(instance, set())
        if event.parent_block_hash is None:
            parent: ChainKey | None = ROOT
        else:
            parent = names.get(event.parent_block_hash)
        if parent is None:
            counts.orphans += len(event.block_hashes)
            return
        if event.lookahead_token_ids:
            counts.lookahead = len(event.lookahead_token_ids[0])
        medium = event.medium or UNSPECIFIED_MEDIUM
        depth = self._blocks[parent].depth if parent in self._blocks else 0
        size = event.block_size
        for i, name in enumerate(event.block_hashes):
            tokens = event.token_ids[i * size : (i + 1) * size]
            extra = _extra(event, i)
            key = chain_key(parent, tokens, extra)
            depth += 1
            block = self._blocks.get(key)
            if block is None:
                block = Block(tuple(tokens), parent, depth)
                self._blocks[key] = block
            else:
                self._blocks.move_to_end(key)
            block.holders.setdefault(instance, set()).add(medium)
            names[name] = key
            held.add(key)
            parent = key
            counts.stored += 1
        self._bound()

    def _resolve_states(self, instance: str) -> None:
        pending = self._pending.get(instance)
        if not pending:
            return
        names = self._names.get(instance, {})
        stateful = self._stateful.setdefault(instance, set())
        left: list[tuple[int, BlockHash]] = []
        for group, name in pending:
            key = names.get(name)
            block = self._blocks.get(key) if key is not None else None
            if key is None or block is None:
                left.append((group, name))
                continue
            block.states.setdefault(instance, set()).add(group)
            stateful.add(key)
        self._pending[instance] = left[-MAX_PENDING_STATES:]

    def _remove(self, instance: str, event: BlocksRemoved, counts: InstanceCounts) -> None:
        names = self._names.get(instance, {})
        group = event.group_idx
        if group is not None and counts.groups.get(group) == MAMBA_KIND:
            self._remove_states(instance, group, event.block_hashes, counts)
            return
        held = self._held.get(instance, set())
        for name in event.block_hashes:
            key = names.get(name)
            block = self._blocks.get(key) if key is not None else None
            if key is None or block is None or instance not in block.holders:
                continue
            media = block.holders[instance]
            if event.medium is None:
                media.clear()
            else:
                media.discard(event.medium)
            if not media:
                del block.holders[instance]
                held.discard(key)
            counts.removed += 1

    def _remove_states(
        self, instance: str, group: int, hashes: Sequence[BlockHash], counts: InstanceCounts
    ) -> None:
        names = self._names.get(instance, {})
        gone = set(hashes)
        if instance in self._pending:
            self._pending[instance] = [p for p in self._pending[instance] if p[1] not in gone]
        for name in hashes:
            key = names.get(name)
            block = self._blocks.get(key) if key is not None else None
            groups = block.states.get(instance) if block is not None else None
            if block is None or not groups or group not in groups:
                continue
            groups.discard(group)
            if not groups:
                del block.states[instance]
            counts.removed += 1

    def _bound(self) -> None:
        while len(self._blocks) > self.max_blocks:
            key, block = self._blocks.popitem(last=False)
            for instance in block.holders:
                self._held.get(instance, set()).discard(key)
            for instance in block.states:
                self._stateful.get(instance, set()).discard(key)
            self.forgotten += 1

    # --- questions --------------------------------------------------------------------------

    def match(self, instance: str, keys: Sequence[ChainKey], block_size: int) -> Match:
        """How many leading blocks of a prompt (its `keys`) `instance` holds, and where; for a
        hybrid also where within that run every mamba group keeps a state."""
        mamba = self.mamba_groups(instance)
        blocks = 0
        by_medium: dict[str, int] = {}
        open_media: set[str] | None = None
        state_blocks: list[int] = []
        for key in keys:
            block = self._blocks.get(key)
            media = block.holders.get(instance) if block is not None else None
            if block is None or not media:
                break
            blocks += 1
            open_media = set(media) if open_media is None else open_media & media
            for medium in open_media:
                by_medium[medium] = blocks * block_size
            if mamba and mamba <= block.states.get(instance, set()):
                state_blocks.append(blocks)
        if not mamba:
            return Match(blocks, blocks * block_size, by_medium)
        usable = {
            medium: max((b * block_size for b in state_blocks if b * block_size <= run), default=0)
            for medium, run in by_medium.items()
        }
        return Match(blocks, blocks * block_size, usable, tuple(state_blocks))

    def groups(self, instance: str) -> dict[int, str]:
        """The KV cache groups `instance`'s events named (index → kind; empty: none named)."""
        counts = self.counts.get(instance)
        return dict(counts.groups) if counts is not None else {}

    def lookahead(self, instance: str) -> int:
        """The tokens after each block that `instance`'s block hashes cover (0: none)."""
        counts = self.counts.get(instance)
        return counts.lookahead if counts is not None else 0

    def mamba_groups(self, instance: str) -> set[int]:
        return {g for g, kind in self.groups(instance).items() if kind == MAMBA_KIND}

    def blocks_held(self, instance: str) -> int:
        return len(self._held.get(instance, ()))

    def leaves(self, limit: int) -> list[tuple[list[tuple[int, ...]], dict[str, set[str]]]]:
        """The deepest chains still held somewhere, longest first: each as its blocks' tokens
        from the root and who holds the whole chain (instance → media held at every block)."""
        parents = {block.parent for block in self._blocks.values() if block.holders}
        tips = sorted(
            (
                (key, block)
                for key, block in self._blocks.items()
                if block.holders and key not in parents
            ),
            key=lambda item: -item[1].depth,
        )
        out: list[tuple[list[tuple[int, ...]], dict[str, set[str]]]] = []
        for key, _block in tips[:limit]:
            chain: list[tuple[int, ...]] = []
            holders: dict[str, set[str]] | None = None
            cursor: ChainKey | None = key
            while cursor and (block := self._blocks.get(cursor)) is not None:
                chain.append(block.tokens)
                now = {name: set(media) for name, media in block.holders.items()}
                holders = now if holders is None else _common(holders, now)
                cursor = block.parent
            if cursor:  # an ancestor was forgotten: the chain cannot be spelled from the root
                continue
            out.append((chain[::-1], holders or {}))
        return out


def _common(a: dict[str, set[str]], b: dict[str, set[str]]) -> dict[str, set[str]]:
    return {name: a[name] & b[name] for name in a.keys() & b.keys() if a[name] & b[name]}


def _extra(event: BlocksStored, i: int) -> Any:
    extra = event.extra_keys[i] if event.extra_keys and i < len(event.extra_keys) else None
    keys = None if event.lora_name is None and extra is None else (event.lora_name, extra)
    ahead = event.lookahead_token_ids
    return _with_lookahead(keys, ahead[i]) if ahead and i < len(ahead) else keys


def _with_lookahead(keys: Any, ahead: tuple[int, ...]) -> Any:
    """A block's extra key with the tokens after it that its hash covers: distinct from any key
    without them, so a block hashed ahead never meets one that was not."""
    return ("lookahead", keys, ahead)
