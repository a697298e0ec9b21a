"""The snapshots a `since` argument names: short ids, bounded, oldest dropped first."""

from __future__ import annotations

from graph_kvcache_mcp.state import Snapshots


def test_snapshots_keep_the_last_few_under_short_distinct_ids() -> None:
    snapshots: Snapshots[int] = Snapshots("kv", limit=3)
    ids = [snapshots.keep(value) for value in range(4)]
    assert len(set(ids)) == 4 and all(i.startswith("kv-") and len(i) == 11 for i in ids)
    assert snapshots.find(ids[0]) is None  # the oldest went when the fourth came
    assert [snapshots.find(i) for i in ids[1:]] == [1, 2, 3]
    assert snapshots.find("kv-unknown") is None
