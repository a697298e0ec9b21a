"""Whether the fleet index knows every KV cache group of an instance. Pure: no I/O.

A hybrid's events name each group (`group_idx`, `kv_cache_spec_kind`) on every step, so one
stored request shows them all. Until then, or when a group's kind is one the index does not
model, a prediction for that instance is a guess and says why.
"""

from __future__ import annotations

from collections.abc import Mapping

from graph_kvcache_mcp.domain.fleet.events import CHAIN_KINDS, MAMBA_KIND

MODELLED_KINDS = CHAIN_KINDS | {MAMBA_KIND}


def groups_gap(groups: Mapping[int, str], *, hybrid: bool | None) -> str | None:
    """Why the index cannot trust what it knows of an instance's KV cache groups, or None.

    `groups` are the groups its events named (index → kind); `hybrid` is what its
    `vllm:cache_config_info` says (None: it does not say).
    """
    if not groups:
        if hybrid:
            return (
                "a hybrid (its cache config names a mamba cache) whose KV cache groups no event "
                "has named yet: send it one request first"
            )
        return None
    missing = sorted(set(range(max(groups) + 1)) - groups.keys())
    if missing:
        return f"its events have not named KV cache groups {missing} yet: send it one request"
    unmodelled = sorted({kind for kind in groups.values() if kind not in MODELLED_KINDS})
    if unmodelled:
        return f"KV cache group kinds {unmodelled} are not modelled: the prediction may be high"
    if not CHAIN_KINDS & set(groups.values()):
        return "its events named no attention group: the prediction is a guess"
    return None
