"""The identity record EngineKVConnector publishes: what it holds, and records refused."""

from __future__ import annotations

import json

from graph_kvcache_mcp.domain.vllm.kv_blocks import KEY_SCHEME_VERSION, KvModelIdentity
from graph_kvcache_mcp.domain.vllm.kv_identity_file import (
    PublishedKvIdentity,
    identity_file_json,
    parse_identity_file,
    published_identity,
)

IDENTITY = KvModelIdentity(
    served_model="tiny",
    architecture="LlamaForCausalLM",
    dtype="bfloat16",
    num_layers=2,
    num_kv_heads=2,
    head_size=16,
    head_size_v=16,
    block_size=32,
    page_bytes=4096,
    layout="cpu:LBHNC:vec:auto",
    vllm_version="0.32.0",
)


def test_a_dense_models_record_round_trips_with_its_digest_and_block_size() -> None:
    record = published_identity(IDENTITY, None)
    assert parse_identity_file(identity_file_json(record)) == record
    assert (record.identity_digest, record.block_size) == (IDENTITY.digest, 32)
    assert (record.key_scheme, record.state_identity_digest) == (KEY_SCHEME_VERSION, None)


def test_the_record_counts_the_tensor_parallel_ranks_and_older_records_mean_one() -> None:
    record = published_identity(IDENTITY, None, tensor_parallel=4)
    assert parse_identity_file(identity_file_json(record)) == record
    assert record.tensor_parallel == 4
    older = record.model_dump(exclude={"tensor_parallel"})
    parsed = parse_identity_file(json.dumps(older))
    assert isinstance(parsed, PublishedKvIdentity) and parsed.tensor_parallel == 1
    assert "not a valid record" in str(
        parse_identity_file(json.dumps({**older, "tensor_parallel": 0}))
    )


def test_a_hybrids_record_names_its_state_identity() -> None:
    states = IDENTITY.model_copy(update={"layout": "cpu:LBHNC:vec:auto:mamba-state"})
    assert published_identity(IDENTITY, states).state_identity_digest == states.digest


def test_garbage_and_another_key_scheme_are_reasons_not_records() -> None:
    assert "not a valid record" in str(parse_identity_file("{not json"))
    assert "not a valid record" in str(parse_identity_file('{"block_size": 32}'))
    other = published_identity(IDENTITY, None).model_copy(update={"key_scheme": 99})
    reason = parse_identity_file(identity_file_json(other))
    assert not isinstance(reason, PublishedKvIdentity)
    assert "scheme 99" in reason
