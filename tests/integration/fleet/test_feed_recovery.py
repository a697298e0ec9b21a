"""The event feed's recovery: replay on connect, after a lost batch and after a restart, both
encodings, garbage skipped. Against a stand-in publisher (tests/support/kv_event_publisher.py)
because vLLM cannot be made to lose a batch or speak its older encoding on demand."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from graph_kvcache_mcp.connectors.fleet.feed import EventFeed
from graph_kvcache_mcp.domain.fleet.index import BlockIndex, prompt_keys
from tests.support.kv_event_publisher import StandInPublisher, block_stored

BS = 4
TOKENS = list(range(1, 17))


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> dict[str, Any]:
    return block_stored(hashes, parent, tokens, block_size=BS)


@pytest.fixture
def publisher() -> Iterator[StandInPublisher]:
    with tempfile.TemporaryDirectory(prefix="kvpub-") as tmp:
        pub = StandInPublisher(tmp)
        try:
            yield pub
        finally:
            pub.close()


def held(index: BlockIndex) -> int:
    return index.match("x", prompt_keys(TOKENS, BS), BS).tokens


def feed_for(pub: StandInPublisher, index: BlockIndex) -> EventFeed:
    return EventFeed("x", pub.endpoint, pub.replay_endpoint, index)


def test_a_late_subscriber_rebuilds_the_index_from_the_replay_buffer(
    publisher: StandInPublisher,
) -> None:
    publisher.publish([stored([1, 2], None, TOKENS[:8])])
    publisher.publish([["BlockStored", [3], 2, TOKENS[8:12], BS, None, "GPU", None]])  # array
    index = BlockIndex()
    feed = feed_for(publisher, index)
    try:
        feed.sync()
        assert held(index) == 12
        assert feed.encodings == {"map", "array"}
        assert feed.tracker.synced and feed.tracker.last_seq == 1
    finally:
        feed.close()


def test_a_batch_lost_on_the_live_feed_is_replayed_and_garbage_is_counted(
    publisher: StandInPublisher,
) -> None:
    index = BlockIndex()
    feed = feed_for(publisher, index)
    try:
        feed.sync()
        publisher.publish([stored([1], None, TOKENS[:4])])
        publisher.publish([stored([2], 1, TOKENS[4:8])], live=False)  # lost on the live feed
        publisher.publish([stored([3], 2, TOKENS[8:12])])
        publisher.publish([], raw=b"\xc1 not msgpack")
        feed.sync()
        assert held(index) == 12 and feed.tracker.last_seq == 3
        assert feed.bad_payloads == 1 and not feed.tracker.history_complete  # its events: lost
    finally:
        feed.close()


def test_a_restart_drops_the_old_entries_and_rebuilds_from_the_new_buffer(
    publisher: StandInPublisher,
) -> None:
    index = BlockIndex()
    feed = feed_for(publisher, index)
    try:
        publisher.publish([stored([1, 2, 3], None, TOKENS[:12])])
        feed.sync()
        assert held(index) == 12
        publisher.restart()
        publisher.publish([stored([7], None, TOKENS[:4])])
        feed.sync()
        assert feed.tracker.resets == 1
        assert held(index) == 4
    finally:
        feed.close()


def test_a_feed_whose_buffer_moved_on_is_marked_partial(publisher: StandInPublisher) -> None:
    publisher.publish([stored([1], None, TOKENS[:4])])
    publisher.publish([stored([2], 1, TOKENS[4:8])])
    publisher.buffer.pop(0)  # vLLM's buffer_steps bound dropped the oldest batch
    index = BlockIndex()
    feed = feed_for(publisher, index)
    try:
        feed.sync()
        assert not feed.tracker.history_complete
        assert index.counts["x"].orphans == 1 and held(index) == 0
    finally:
        feed.close()


def test_a_restart_the_live_feed_missed_is_found_by_the_replay(publisher: StandInPublisher) -> None:
    index = BlockIndex()
    feed = feed_for(publisher, index)
    try:
        publisher.publish([stored([1, 2, 3], None, TOKENS[:12])])
        publisher.publish([stored([9], None, [50, 51, 52, 53])])
        feed.sync()
        publisher.restart()
        publisher.publish([stored([7], None, TOKENS[:4])], live=False)  # before we reconnected
        feed.sync()
        assert feed.tracker.resets == 1 and feed.tracker.last_seq == 0
        assert held(index) == 4
    finally:
        feed.close()
