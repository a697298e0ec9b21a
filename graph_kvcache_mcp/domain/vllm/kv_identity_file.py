"""What `EngineKVConnector` publishes so others can name its blocks: the model's KV identity
digest, the block size and the key scheme. Pure: no I/O.

Only the vLLM process knows the identity (dtype, KV geometry, layout and kernel ISA, read from its
KV cache config); with this record the fleet view computes a prompt's block keys itself
(`kv_blocks.block_keys`) and asks the engine which it holds, without touching vLLM.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graph_kvcache_mcp.domain.vllm.kv_blocks import KEY_SCHEME_VERSION, KvModelIdentity

IDENTITY_FILE_KEY = "identity_file"
"""The `kv_connector_extra_config` key naming where the connector writes the record."""
IDENTITY_FILE_NAME = "kv-identity.json"
MAX_IDENTITY_FILE_BYTES = 4096


class PublishedKvIdentity(BaseModel):
    """The identity record `EngineKVConnector` writes once it knows its KV cache layout."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    key_scheme: int = Field(description="kv_blocks.KEY_SCHEME_VERSION of the writer.")
    identity_digest: str = Field(min_length=64, max_length=64)
    block_size: int = Field(ge=1)
    state_identity_digest: str | None = Field(
        None, description="A hybrid's Mamba-state identity; None for a dense model."
    )
    served_model: str
    tensor_parallel: int = Field(
        1,
        ge=1,
        description="Tensor-parallel ranks, each storing a block under its own key "
        "(`engine_kv.device.rank_key`); 1 in records written before ranks were keyed.",
    )


def published_identity(
    identity: KvModelIdentity, state_identity: KvModelIdentity | None, *, tensor_parallel: int = 1
) -> PublishedKvIdentity:
    return PublishedKvIdentity(
        key_scheme=KEY_SCHEME_VERSION,
        identity_digest=identity.digest,
        block_size=identity.block_size,
        state_identity_digest=None if state_identity is None else state_identity.digest,
        served_model=identity.served_model,
        tensor_parallel=tensor_parallel,
    )


def identity_file_json(record: PublishedKvIdentity) -> str:
    return record.model_dump_json(indent=1) + "\n"


def parse_identity_file(text: str) -> PublishedKvIdentity | str:
    """The record in `text`, or why it cannot be used (a reason, for "not checked")."""
    try:
        record = PublishedKvIdentity.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        return f"the connector's identity file is not a valid record ({type(exc).__name__})"
    if record.key_scheme != KEY_SCHEME_VERSION:
        return (
            f"the connector keys blocks by scheme {record.key_scheme}, this tool computes "
            f"scheme {KEY_SCHEME_VERSION}: use the same graph-kvcache-mcp version in both"
        )
    return record
