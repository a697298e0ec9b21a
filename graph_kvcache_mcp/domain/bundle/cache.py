"""The cache's verdict on one compile, from what the store answered. Pure: no I/O.

A compile looks its key up, assembles when the store has no usable entry, and puts the new
bundle when the lookup reached the store. What the lookup and the put answered decides, in one
table, what the caller is told (`cache`, `reason`, `stored`) and which counters move:

| lookup                 | put              | cache       | counters                          |
|------------------------|------------------|-------------|-----------------------------------|
| `StoreOff`             | not tried        | off         | none                              |
| `Unavailable`          | not tried        | unavailable | cache_unavailable                 |
| `Bundle` (usable hit)  | not tried        | hit         | cache_hits                        |
| `Miss`                 | `Stored`         | miss        | cache_misses                      |
| `Miss`                 | `Unavailable`    | unavailable | cache_unavailable                 |
| `RejectedBundle` (stale, forged, corrupt) | `Stored` | miss | rejected_entries, cache_misses |
| `RejectedBundle`       | `Unavailable`    | unavailable | rejected_entries, cache_unavailable |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from graph_kvcache_mcp.domain.bundle.codec import RejectedBundle
from graph_kvcache_mcp.domain.bundle.compiled import Bundle
from graph_kvcache_mcp.domain.outcomes import Miss, Stored, Unavailable

CacheState = Literal["hit", "miss", "unavailable", "off"]
Counter = Literal["cache_hits", "cache_misses", "cache_unavailable", "rejected_entries"]
StoredState = Literal["stored_new", "already_present"]


@dataclass(frozen=True, slots=True)
class StoreOff:
    """No store takes part in this compile."""


Lookup: TypeAlias = StoreOff | Unavailable | Miss | Bundle | RejectedBundle
"""What the lookup came to: no store, the store down, no entry, a usable bundle, or an entry
the codec refused (`RejectedBundle`: corrupt, foreign, another format or key, unsigned, forged)."""

PutAnswer: TypeAlias = Stored | Unavailable | None
"""What the put of the new bundle answered; None when none was tried."""

KEPT_FIRST = "the store already held this key; it keeps the first value written"


@dataclass(frozen=True, slots=True)
class CacheVerdict:
    """What a compile reports about the cache, and which counters it moves (one each)."""

    cache: CacheState
    counters: tuple[Counter, ...]
    reason: str | None = None
    stored: StoredState | None = None


def needs_store(lookup: Lookup) -> bool:
    """Whether the bundle assembled after this lookup is put: the lookup reached the store and
    found nothing usable under the key."""
    return isinstance(lookup, Miss | RejectedBundle)


def cache_verdict(lookup: Lookup, put: PutAnswer) -> CacheVerdict:
    """The verdict for one compile (see the module's table).

    Raises:
        ValueError: `put` is None after a lookup that needs a store, or given after one that
            does not (`needs_store`): a caller's bug, never the store's state.
    """
    if needs_store(lookup) != (put is not None):
        wanted = "a put answer" if put is None else "no put"
        raise ValueError(f"a {type(lookup).__name__} lookup takes {wanted}")
    match lookup:
        case StoreOff():
            return CacheVerdict("off", ())
        case Unavailable(reason=reason):
            return CacheVerdict("unavailable", ("cache_unavailable",), f"store not used: {reason}")
        case Bundle():
            return CacheVerdict("hit", ("cache_hits",))
        case Miss():
            return _after_put(put, rejected=None)
        case RejectedBundle(reason=reason):
            return _after_put(put, rejected=f"stored entry unusable, treated as a miss: {reason}")


def _after_put(put: PutAnswer, *, rejected: str | None) -> CacheVerdict:
    rejected_count: tuple[Counter, ...] = () if rejected is None else ("rejected_entries",)
    match put:
        case Unavailable(reason=reason):
            return CacheVerdict(
                "unavailable",
                (*rejected_count, "cache_unavailable"),
                join_notes(rejected, f"bundle not stored: {reason}"),
            )
        case Stored(state=state):
            # A rejected entry explains why the store kept its value; only a plain miss needs
            # the note that the first value written wins.
            kept = KEPT_FIRST if state == "already_present" and rejected is None else None
            return CacheVerdict(
                "miss", (*rejected_count, "cache_misses"), join_notes(rejected, kept), state
            )
        case None:  # ruled out by cache_verdict's check
            raise ValueError("a lookup that needs a store takes a put answer")


def join_notes(*notes: str | None) -> str | None:
    """The notes that are present, joined with '; ', or None when there are none."""
    present = [note for note in notes if note]
    return "; ".join(present) if present else None
