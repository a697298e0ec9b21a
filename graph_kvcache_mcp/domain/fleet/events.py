"""vLLM's KV events, as decoded msgpack objects become typed values (no I/O, no msgpack here).

A batch is `[ts, events, data_parallel_rank]`. Each event is, since vLLM PR #42892, a map with a
`"type"` key; before, a positional array whose first item is the type name. Both are read; the
positional field order is vLLM's struct order (`BlockStored`: block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
kv_cache_spec_sliding_window, locality, ownership, session_id, lookahead_token_ids).

vLLM 0.33 hashes each block together with the L tokens after it when speculative decoding (EAGLE,
MTP) runs without a KV connector, and then names those tokens per block in `lookahead_token_ids`:
two requests that share a block but not the tokens after it hold two different blocks.

A hybrid model publishes one `BlockStored` per KV cache group per step. A mamba group's carries
the step's token ids but, except on the step that keeps a state, no hash (and then one: the
attention group's hash at that position), so its tokens need not fill its hashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

BlockHash = int | bytes | str
"""vLLM's external block hash: an int (lower 64 bits) by default, bytes with some settings."""

STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
MAMBA_KIND = "mamba"
ATTENTION_KIND = "full_attention"
CHAIN_KINDS = frozenset({ATTENTION_KIND, "mla_attention", "sink_full_attention"})
"""Group kinds that keep every full block of the prompt's token chain: plain attention, and the
MLA (DeepSeek, Kimi, GLM) and attention-sink variants of it, whose blocks are addressed alike."""


@dataclass(frozen=True, slots=True)
class BlocksStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    """The group's kind ("full_attention", "mamba", ...); None from a vLLM that does not say."""
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None
    """Per block, the tokens after it that its hash covers (vLLM 0.33 lookahead hashing); None
    when the instance does not hash ahead."""


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllCleared:
    pass


Event = BlocksStored | BlocksRemoved | AllCleared
Encoding = Literal["map", "array"]


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[Event, ...]
    encodings: frozenset[Encoding] = field(default_factory=frozenset)
    undecodable: int = 0
    """Events of a type this reader does not know, or of a shape it cannot read."""


class BadBatch(ValueError):
    """A payload that is not an event batch at all."""


def decode_batch(raw: Any) -> EventBatch:
    """The batch that the msgpack value `raw` holds.

    Raises:
        BadBatch: `raw` is not `[ts, events, ...]`.
    """
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes) or len(raw) < 2:
        raise BadBatch("an event batch is [ts, events, rank]")
    ts, items = raw[0], raw[1]
    if not isinstance(ts, int | float) or not isinstance(items, Sequence):
        raise BadBatch("an event batch is [ts, events, rank]")
    events: list[Event] = []
    encodings: set[Encoding] = set()
    undecodable = 0
    for item in items:
        decoded = _decode_event(item)
        if decoded is None:
            undecodable += 1
            continue
        event, encoding = decoded
        events.append(event)
        encodings.add(encoding)
    return EventBatch(float(ts), tuple(events), frozenset(encodings), undecodable)


def _decode_event(item: Any) -> tuple[Event, Encoding] | None:
    if isinstance(item, dict):
        kind, fields, encoding = item.get("type"), item, "map"
    elif isinstance(item, list | tuple) and item and isinstance(item[0], str):
        kind, encoding = item[0], "array"
        names = STORED_FIELDS if kind == "BlockStored" else REMOVED_FIELDS
        fields = dict(zip(names, item[1:], strict=False))
    else:
        return None
    try:
        match kind:
            case "BlockStored":
                event: Event = _stored(fields)
            case "BlockRemoved":
                event = BlocksRemoved(
                    tuple(_hashes(fields["block_hashes"])),
                    _text(fields.get("medium")),
                    _small_int(fields.get("group_idx")),
                )
            case "AllBlocksCleared":
                event = AllCleared()
            case _:
                return None
    except (KeyError, TypeError, ValueError):
        return None
    return event, encoding  # type: ignore[return-value]


def _stored(fields: dict[str, Any]) -> BlocksStored:
    hashes = tuple(_hashes(fields["block_hashes"]))
    tokens = tuple(int(t) for t in fields["token_ids"])
    size = int(fields["block_size"])
    kind = _text(fields.get("kv_cache_spec_kind"))
    if size <= 0 or (kind != MAMBA_KIND and len(tokens) != len(hashes) * size):
        raise ValueError("token_ids must fill block_hashes × block_size")
    extra = fields.get("extra_keys")
    parent = fields.get("parent_block_hash")
    lookahead = _lookahead(fields.get("lookahead_token_ids"), kind, len(hashes))
    return BlocksStored(
        hashes,
        None if parent is None else _hash(parent),
        tokens,
        size,
        _text(fields.get("medium")),
        _text(fields.get("lora_name")),
        tuple(_freeze(e) for e in extra) if isinstance(extra, list | tuple) else None,
        _small_int(fields.get("group_idx")),
        kind,
        lookahead,
    )


def _lookahead(values: Any, kind: str | None, blocks: int) -> tuple[tuple[int, ...], ...] | None:
    if values is None:
        return None
    if not isinstance(values, list | tuple) or not all(isinstance(v, list | tuple) for v in values):
        raise TypeError("lookahead_token_ids must be a list of token lists")
    if kind != MAMBA_KIND and len(values) != blocks:
        raise ValueError("lookahead_token_ids must name one token list per block hash")
    return tuple(tuple(int(t) for t in v) for v in values)


def _hashes(values: Any) -> list[BlockHash]:
    if not isinstance(values, list | tuple):
        raise TypeError("block_hashes must be a list")
    return [_hash(v) for v in values]


def _hash(value: Any) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes | str):
        raise TypeError("a block hash is an int, bytes or str")
    return value


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _small_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value
