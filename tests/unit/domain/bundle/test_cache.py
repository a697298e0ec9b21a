"""The cache verdict: every lookup and put answer, what the compile reports and what it counts."""

from __future__ import annotations

import pytest

from graph_kvcache_mcp.domain.bundle import (
    Bundle,
    CacheVerdict,
    Lookup,
    RejectedBundle,
    StoreOff,
    cache_verdict,
    compile_bundle,
    needs_store,
)
from graph_kvcache_mcp.domain.bundle.cache import KEPT_FIRST, PutAnswer
from graph_kvcache_mcp.domain.outcomes import Miss, Stored, Unavailable
from tests.support.bundles import corpus, request

USABLE: Bundle = compile_bundle(request(corpus(5), "prefix cache", token_budget=400))
DOWN = Unavailable("engine not reachable")
FULL = Unavailable("engine refused the put (507)")
FORGED = RejectedBundle("checksum does not match the payload (corrupt or tampered entry)")
STALE = RejectedBundle("stored format 'ctxbundle/0' is not 'ctxbundle/1'")
UNUSABLE = "stored entry unusable, treated as a miss: "

ROWS: list[tuple[str, Lookup, PutAnswer, CacheVerdict]] = [
    ("no store", StoreOff(), None, CacheVerdict("off", ())),
    (
        "store down before the lookup",
        DOWN,
        None,
        CacheVerdict("unavailable", ("cache_unavailable",), "store not used: engine not reachable"),
    ),
    ("usable hit", USABLE, None, CacheVerdict("hit", ("cache_hits",))),
    (
        "miss, stored",
        Miss(),
        Stored("stored_new"),
        CacheVerdict("miss", ("cache_misses",), None, "stored_new"),
    ),
    (
        "miss, a racing writer stored first",
        Miss(),
        Stored("already_present"),
        CacheVerdict("miss", ("cache_misses",), KEPT_FIRST, "already_present"),
    ),
    (
        "miss, put failed",
        Miss(),
        FULL,
        CacheVerdict(
            "unavailable",
            ("cache_unavailable",),
            "bundle not stored: engine refused the put (507)",
        ),
    ),
    (
        "forged entry, stored",
        FORGED,
        Stored("stored_new"),
        CacheVerdict(
            "miss", ("rejected_entries", "cache_misses"), UNUSABLE + FORGED.reason, "stored_new"
        ),
    ),
    (
        "stale entry, the store keeps it",
        STALE,
        Stored("already_present"),
        CacheVerdict(
            "miss",
            ("rejected_entries", "cache_misses"),
            UNUSABLE + STALE.reason,
            "already_present",
        ),
    ),
    (
        "forged entry, put failed",
        FORGED,
        FULL,
        CacheVerdict(
            "unavailable",
            ("rejected_entries", "cache_unavailable"),
            f"{UNUSABLE}{FORGED.reason}; bundle not stored: engine refused the put (507)",
        ),
    ),
]


@pytest.mark.parametrize(
    ("lookup", "put", "verdict"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS]
)
def test_each_lookup_and_put_answer_has_one_verdict(
    lookup: Lookup, put: PutAnswer, verdict: CacheVerdict
) -> None:
    assert cache_verdict(lookup, put) == verdict


@pytest.mark.parametrize(
    ("lookup", "stores"),
    [(StoreOff(), False), (DOWN, False), (USABLE, False), (Miss(), True), (FORGED, True)],
    ids=["off", "down", "hit", "miss", "rejected"],
)
def test_only_a_lookup_that_reached_the_store_and_found_nothing_usable_is_stored(
    lookup: Lookup, stores: bool
) -> None:
    assert needs_store(lookup) is stores


@pytest.mark.parametrize(
    ("lookup", "put"),
    [(Miss(), None), (FORGED, None), (StoreOff(), Stored("stored_new")), (USABLE, FULL)],
    ids=["miss-without-put", "rejected-without-put", "off-with-put", "hit-with-put"],
)
def test_a_put_answer_that_does_not_fit_the_lookup_is_a_caller_bug(
    lookup: Lookup, put: PutAnswer
) -> None:
    with pytest.raises(ValueError, match="lookup takes"):
        cache_verdict(lookup, put)


def test_every_verdict_moves_each_counter_at_most_once() -> None:
    for _, lookup, put, _ in ROWS:
        counted = cache_verdict(lookup, put).counters
        assert len(set(counted)) == len(counted)
