"""LMCache key → engine key mapping: deterministic, isolated by namespace, always engine-safe."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.engine.keys import check_key
from graph_kvcache_mcp.domain.lmcache.keys import (
    ENGINE_KEY_PREFIX,
    engine_key,
    engine_keys,
)
from graph_kvcache_mcp.errors import ConfigError

MP_KEY = "Qwen/Qwen3-8B@01000100@0@" + "ab" * 32


def test_the_engine_key_is_the_documented_digest() -> None:
    digest = hashlib.sha256(b"lmcache\nv1\n" + MP_KEY.encode()).hexdigest()
    assert engine_key(MP_KEY) == "lmc1:" + digest


def test_the_mapping_is_pinned() -> None:
    """A change here orphans every block already stored: bump KEY_SCHEME_VERSION instead."""
    assert engine_key("m@1@0@ff") == (
        "lmc1:" + hashlib.sha256(b"lmcache\nv1\nm@1@0@ff").hexdigest()
    )
    assert engine_key("m@1@0@ff").startswith(ENGINE_KEY_PREFIX)
    assert len(engine_key("m@1@0@ff")) == len(ENGINE_KEY_PREFIX) + 64


def test_every_field_of_the_lmcache_key_matters() -> None:
    variants = {
        MP_KEY,
        MP_KEY.replace("Qwen3-8B", "Qwen3-4B"),
        MP_KEY.replace("@01000100@", "@01000101@"),
        MP_KEY.replace("@0@", "@1@"),
        MP_KEY + "@salt-a",
    }
    assert len({engine_key(key) for key in variants}) == len(variants)


def test_namespaces_keep_fleets_apart() -> None:
    assert engine_key(MP_KEY, namespace="fleet-a") != engine_key(MP_KEY, namespace="fleet-b")


def test_batch_mapping_equals_one_by_one() -> None:
    keys = [MP_KEY, "other@1@0@00"]
    assert engine_keys(keys, namespace="n") == [engine_key(k, namespace="n") for k in keys]


@pytest.mark.parametrize("namespace", ["", "x" * 129, "tab\there", "naïve"])
def test_an_unusable_namespace_is_refused(namespace: str) -> None:
    with pytest.raises(ConfigError):
        engine_key(MP_KEY, namespace=namespace)


def test_an_empty_lmcache_key_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        engine_key("")


@given(st.text(min_size=1, max_size=400))
def test_any_lmcache_key_maps_to_a_key_the_engine_stores_verbatim(key: str) -> None:
    assert check_key(engine_key(key)) == engine_key(key)
