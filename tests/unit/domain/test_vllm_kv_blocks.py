from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.engine.keys import is_valid_key
from graph_kvcache_mcp.domain.vllm.kv_blocks import (
    KEY_PREFIX,
    KvModelIdentity,
    RejectedBlock,
    block_keys,
    decode_block,
    encode_block,
    unsupported_setup,
)
from tests.support.kv_identity import kv_identity

IDENTITY = kv_identity()
TOKENS = list(range(100, 118))  # four full blocks of 4 and a partial one


def test_block_keys_name_each_full_block_and_skip_the_partial_tail() -> None:
    keys = block_keys(IDENTITY.digest, TOKENS, 4)
    assert len(keys) == 4
    assert all(key.startswith(KEY_PREFIX) and is_valid_key(key) for key in keys)
    assert len(set(keys)) == 4


def test_a_block_key_names_its_whole_prefix_not_just_its_tokens() -> None:
    original = block_keys(IDENTITY.digest, TOKENS, 4)
    changed_second_block = block_keys(IDENTITY.digest, [*TOKENS[:5], 9, *TOKENS[6:]], 4)
    assert changed_second_block[0] == original[0]
    assert all(a != b for a, b in zip(changed_second_block[1:], original[1:], strict=True))


def test_the_same_prefix_gives_the_same_keys_whatever_follows_it() -> None:
    assert block_keys(IDENTITY.digest, TOKENS[:8], 4) == block_keys(IDENTITY.digest, TOKENS, 4)[:2]


@pytest.mark.parametrize(
    "change",
    [
        {"served_model": "other-model"},
        {"dtype": "float32"},
        {"num_layers": 3},
        {"num_kv_heads": 4},
        {"block_size": 8},
        {"layout": "cpu:LBHNC:amx:auto"},
        {"tensor_parallel": "0/2"},
        {"vllm_version": "0.33.0"},
    ],
)
def test_any_change_of_model_identity_changes_every_key(change: dict[str, object]) -> None:
    other = IDENTITY.model_copy(update=change)
    mine, theirs = block_keys(IDENTITY.digest, TOKENS, 4), block_keys(other.digest, TOKENS, 4)
    assert not set(mine) & set(theirs)


def test_a_cache_salt_separates_keys() -> None:
    salted = block_keys(IDENTITY.digest, TOKENS, 4, cache_salt="tenant-a")
    assert not set(salted) & set(block_keys(IDENTITY.digest, TOKENS, 4))


def test_an_encoded_block_decodes_to_its_payload() -> None:
    key = block_keys(IDENTITY.digest, TOKENS, 4)[0]
    payload = bytes(range(256)) * (IDENTITY.block_bytes // 256)
    decoded = decode_block(encode_block(key, IDENTITY, payload), key, IDENTITY)
    assert isinstance(decoded, memoryview)
    assert bytes(decoded) == payload


def test_stored_bytes_exceed_the_kv_bytes_by_a_small_header_only() -> None:
    key = block_keys(IDENTITY.digest, TOKENS, 4)[0]
    value = encode_block(key, IDENTITY, bytes(IDENTITY.block_bytes))
    assert len(value) - IDENTITY.block_bytes < 512


def _value(key: str, identity: KvModelIdentity = IDENTITY) -> bytes:
    return encode_block(key, identity, bytes([7]) * identity.block_bytes)


KEY = block_keys(IDENTITY.digest, TOKENS, 4)[0]
OTHER_KEY = block_keys(IDENTITY.digest, TOKENS, 4)[1]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (_value(OTHER_KEY), "key"),
        (_value(KEY, IDENTITY.model_copy(update={"dtype": "float16"})), "identity"),
        (_value(KEY)[:-1], "payload"),
        (_value(KEY)[:-1] + b"\x08", "checksum"),
        (b"GKVB" + _value(KEY)[4:5].replace(b"\x01", b"\x02") + _value(KEY)[5:], "format"),
        (b"XXXX" + _value(KEY)[4:], "magic"),
        (b"", "too short"),
        (_value(KEY)[:20], "header length"),
    ],
)
def test_a_value_for_another_key_identity_or_a_damaged_one_is_rejected(
    value: bytes, reason: str
) -> None:
    decoded = decode_block(value, KEY, IDENTITY)
    assert isinstance(decoded, RejectedBlock)
    assert reason in decoded.reason


@given(st.binary(max_size=4096))
def test_arbitrary_bytes_never_decode_to_a_payload(value: bytes) -> None:
    assert isinstance(decode_block(value, KEY, IDENTITY), RejectedBlock)


def test_a_payload_given_in_parts_encodes_exactly_as_the_joined_payload() -> None:
    key = block_keys(IDENTITY.digest, TOKENS, 4)[0]
    pages = [bytes([layer]) * IDENTITY.page_bytes for layer in range(IDENTITY.num_layers)]
    parts = [memoryview(page) for page in pages]
    assert encode_block(key, IDENTITY, parts) == encode_block(key, IDENTITY, b"".join(pages))


SUPPORTED = {
    "device": "cpu",
    "tensor_parallel": 1,
    "pipeline_parallel": 1,
    "kv_cache_groups": 1,
    "spec_kind": "FullAttentionSpec",
    "sliding_window": None,
}


def test_the_cpu_full_attention_single_rank_setup_is_handled() -> None:
    assert unsupported_setup(**SUPPORTED) is None  # type: ignore[arg-type]


def test_a_single_rank_cuda_kv_cache_is_handled_by_the_device_copy_path() -> None:
    assert unsupported_setup(**{**SUPPORTED, "device": "cuda"}) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_a_tensor_parallel_cuda_kv_cache_is_handled_with_per_rank_keys(ranks: int) -> None:
    setup = {**SUPPORTED, "device": "cuda", "tensor_parallel": ranks}
    assert unsupported_setup(**setup) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"device": "xpu"}, "LMCache's MP connector"),
        ({"device": "tpu"}, "CPU and CUDA KV caches only"),
        ({"tensor_parallel": 2}, "tensor parallelism on CUDA only"),
        ({"pipeline_parallel": 2}, "pipeline parallel size 1 only"),
        ({"device": "cuda", "tensor_parallel": 2, "pipeline_parallel": 2}, "pipeline parallel"),
        ({"kv_cache_groups": 2}, "one KV cache group"),
        ({"spec_kind": "MLAAttentionSpec"}, "full-attention"),
        ({"sliding_window": 4096}, "sliding window"),
    ],
)
def test_setups_the_connector_cannot_move_are_refused_with_the_reason(
    change: dict[str, object], says: str
) -> None:
    problem = unsupported_setup(**{**SUPPORTED, **change})  # type: ignore[arg-type]
    assert problem is not None and says in problem
