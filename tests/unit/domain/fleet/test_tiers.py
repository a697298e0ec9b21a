"""The per-tier arithmetic: a server's /config read for its keying, and the next request's total."""

from __future__ import annotations

import json

import pytest

from graph_kvcache_mcp.domain.fleet.fleet_file import parse_fleet
from graph_kvcache_mcp.domain.fleet.tiers import (
    ENGINE_ADAPTER_MODULE,
    TierHeld,
    connector_tokens,
    engine_connector_cached,
    keying_from_config,
    total_cached,
)
from graph_kvcache_mcp.errors import ConfigError

ENGINE: dict[str, object] = {
    "module_path": ENGINE_ADAPTER_MODULE,
    "adapter_params": {"namespace": "fleet-b"},
}


def config(
    *adapters: dict[str, object], chunk: int = 128, algo: str = "blake3"
) -> dict[str, object]:
    return {
        "mp": {"chunk_size": chunk, "hash_algorithm": algo},
        "storage_manager": {"l2_adapter_config": {"adapters": list(adapters)}},
        "coordinator": {"url": "http://127.0.0.1:9000"},
    }


def test_the_keying_comes_from_the_servers_config() -> None:
    keying = keying_from_config(config({"type": "resp"}, ENGINE, chunk=128, algo="sha256_cbor"))
    assert (keying.chunk_size, keying.hash_algorithm) == (128, "sha256_cbor")
    assert keying.engine_namespace == "fleet-b"
    assert keying.coordinator_url == "http://127.0.0.1:9000"


def test_a_server_without_our_adapter_has_no_engine_namespace() -> None:
    assert keying_from_config(config({"type": "resp"})).engine_namespace is None
    plain: dict[str, object] = {"module_path": ENGINE_ADAPTER_MODULE}
    assert keying_from_config(config(plain)).engine_namespace == "lmcache"
    # redis_resp: LMCache's own adapter, which can delete from the engine
    assert keying_from_config(config({"type": "resp"})).resp_l2
    assert not keying_from_config(config(plain)).resp_l2
    assert keying_from_config({}).chunk_size == 256


def test_the_connector_never_adds_the_last_token_and_counts_whole_chunks() -> None:
    # a prompt held whole is served but its last token (vLLM reported 3,071 of 3,072 held
    # tokens across hosts; bench_hosts.py --kv-connector mp_native)
    assert connector_tokens(512, prompt_tokens=512, chunk_size=256) == 511
    assert connector_tokens(3072, prompt_tokens=3072, chunk_size=256) == 3071
    assert connector_tokens(256, prompt_tokens=512, chunk_size=256) == 256
    assert connector_tokens(768, prompt_tokens=700, chunk_size=256) == 512  # a partial chunk
    assert connector_tokens(512, prompt_tokens=513, chunk_size=256) == 512
    assert connector_tokens(256, prompt_tokens=900, chunk_size=256) == 256
    assert connector_tokens(0, prompt_tokens=0, chunk_size=256) == 0


def held(tokens: int | None) -> TierHeld:
    return TierHeld(tokens=tokens, trusted=True, source="test")


def test_the_total_is_the_longer_of_vllms_own_hit_and_the_connectors() -> None:
    tiers = {"vllm": held(320), "l2": held(768), "l1": held(None)}
    assert total_cached(320, tiers, prompt_tokens=700, chunk_size=256) == 512
    assert total_cached(640, tiers, prompt_tokens=700, chunk_size=256) == 640
    assert total_cached(None, tiers, prompt_tokens=700, chunk_size=256) is None


def test_a_fleet_file_names_each_instances_lmcache_server_under_the_url_policy() -> None:
    entry = {"name": "a", "base_url": "http://127.0.0.1:8001/v1"}
    ok = parse_fleet(
        json.dumps({"instances": [{**entry, "lmcache_http_url": "http://127.0.0.1:8080"}]}),
        source="f.json",
    )
    assert ok.instances[0].lmcache_http_url == "http://127.0.0.1:8080"
    remote = {**entry, "lmcache_http_url": "http://10.9.8.7:8080"}
    with pytest.raises(ConfigError, match="lmcache_http_url"):
        parse_fleet(json.dumps({"instances": [remote]}), source="f.json")


@pytest.mark.parametrize(
    ("vllm_tokens", "present", "prompt_tokens", "expected"),
    [
        (0, [True, True, True], 96, 64),  # the block with the last token is computed
        (0, [True, True, True], 97, 96),
        (0, [False, True, True], 97, 0),  # a chain: nothing after a missing first block
        (32, [False, True, False], 97, 64),  # looked up after vLLM's own hit
        (64, [True, False, False], 97, 64),  # vLLM's own hit is longer
        (0, [], 10, 0),
        (None, [True], 64, None),
    ],
)
def test_the_engine_connectors_total_follows_its_lookup(
    vllm_tokens: int | None, present: list[bool], prompt_tokens: int, expected: int | None
) -> None:
    got = engine_connector_cached(vllm_tokens, present, prompt_tokens=prompt_tokens, block_size=32)
    assert got == expected
