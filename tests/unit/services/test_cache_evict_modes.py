"""`cache_evict tier=l2` deletes nothing and says, per mode, what can delete there: nothing with
our `native_plugin` adapter, LMCache's `resp` adapter in `redis_resp`. (L1 evicts, and the
native mode's answer on a real stack: `tests/integration/services/test_cache_steering.py`.)"""

from __future__ import annotations

import anyio

from graph_kvcache_mcp.services.cache.operations import L2_KEPT, L2_RESP, CacheTarget, evict


def test_an_l2_evict_names_what_can_delete_there_in_each_mode() -> None:
    # tier=l2 returns before any call: the coordinator URL is never dialled
    native = CacheTarget("http://127.0.0.1:9", "ours", "m", [1, 2])
    resp = CacheTarget("http://127.0.0.1:9", "ours", "m", [1, 2], resp_l2=True)
    assert anyio.run(lambda: evict("a", native, tier="l2")).reason == L2_KEPT
    answer = anyio.run(lambda: evict("a", resp, tier="l2"))
    assert (answer.done, answer.reason) == (False, L2_RESP)
    assert "CAN delete engine data" in L2_RESP and "engine keeps every chunk" not in L2_RESP
