"""Which tier vLLM counts an EngineKVConnector hit under (`CacheHitSource` values of 0.32/0.33)."""

from __future__ import annotations

import pytest

from graph_kvcache_mcp.domain.vllm.engine_kv.hit_sources import (
    ENGINE_HIT_SOURCE,
    HitSource,
    engine_hit_source,
)


@pytest.mark.parametrize(
    ("backend", "loopback", "source"),
    [
        ("memory", True, "host"),
        ("memory", False, "external_unspecified"),  # a remote store: vLLM's own label for it
        ("durable", True, "disk"),
        ("durable", False, "disk"),
        (None, True, "external_unspecified"),
        ("unknown", True, "external_unspecified"),
    ],
)
def test_the_engines_backend_and_place_name_the_tier(
    backend: str | None, loopback: bool, source: str
) -> None:
    assert engine_hit_source(backend, engine_on_loopback=loopback) == source


def test_every_source_is_one_of_vllms_cache_hit_sources() -> None:
    vllm_values = {"device", "host", "p2p", "disk", "external_unspecified"}
    assert set(HitSource.__args__) <= vllm_values  # type: ignore[attr-defined]
    assert set(ENGINE_HIT_SOURCE.values()) <= vllm_values
