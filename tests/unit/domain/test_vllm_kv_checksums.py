"""Stored KV values carry a CRC-32 of their payload; values written before carry a sha256, and
both are checked."""

from __future__ import annotations

import hashlib
import json
import zlib

from graph_kvcache_mcp.domain.vllm.kv_blocks import (
    PayloadCheck,
    RejectedBlock,
    block_keys,
    decode_block,
    encode_block,
)
from tests.support.kv_identity import kv_identity

IDENTITY = kv_identity(kv_heads=1, head_size=4, served_model="m")
KEY = block_keys(IDENTITY.digest, [1, 2, 3, 4], 4)[0]
PAYLOAD = bytes(range(128))


def _header(value: bytes) -> dict[str, object]:
    length = int.from_bytes(value[5:9], "big")
    header = json.loads(value[9 : 9 + length])
    assert isinstance(header, dict)
    return header


def test_new_values_carry_the_payloads_crc32_and_no_sha256() -> None:
    header = _header(encode_block(KEY, IDENTITY, PAYLOAD))
    assert header["crc32"] == f"{zlib.crc32(PAYLOAD):08x}"
    assert "sha256" not in header


def test_a_value_written_with_a_sha256_still_decodes_and_its_damage_is_found() -> None:
    fields = _header(encode_block(KEY, IDENTITY, PAYLOAD))
    del fields["crc32"]
    fields["sha256"] = hashlib.sha256(PAYLOAD).hexdigest()
    header = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    value = b"GKVB\x01" + len(header).to_bytes(4, "big") + header + PAYLOAD
    decoded_whole = decode_block(value, KEY, IDENTITY)
    assert isinstance(decoded_whole, memoryview) and bytes(decoded_whole) == PAYLOAD
    damaged = value[:-1] + bytes([value[-1] ^ 1])
    decoded = decode_block(damaged, KEY, IDENTITY)
    assert isinstance(decoded, RejectedBlock) and "checksum" in decoded.reason


def test_a_checksum_fed_in_chunks_matches_the_whole() -> None:
    for kind in ("crc32", "sha256"):
        whole = PayloadCheck(kind, "")
        whole.update(PAYLOAD)
        parts = PayloadCheck(kind, whole.value())
        for start in range(0, len(PAYLOAD), 7):
            parts.update(PAYLOAD[start : start + 7])
        assert parts.matches()
