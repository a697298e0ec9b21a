"""Stored KV values carry a CRC-32C of their payload; values written before carry a zlib CRC-32
or a sha256, and all three are checked."""

from __future__ import annotations

import hashlib
import json
import zlib

import pytest

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


def test_crc32c_is_the_castagnoli_crc() -> None:
    check = PayloadCheck("crc32c", "")
    check.update(b"123456789")
    assert check.value() == "e3069283"  # the standard check value of CRC-32C (RFC 3720)


def test_new_values_carry_the_payloads_crc32c_and_no_other_checksum() -> None:
    header = _header(encode_block(KEY, IDENTITY, PAYLOAD))
    check = PayloadCheck("crc32c", header["crc32c"])  # type: ignore[arg-type]
    check.update(PAYLOAD)
    assert check.matches()
    assert "crc32" not in header and "sha256" not in header


@pytest.mark.parametrize(
    ("kind", "checksum"),
    [
        ("crc32", f"{zlib.crc32(PAYLOAD):08x}"),
        ("sha256", hashlib.sha256(PAYLOAD).hexdigest()),
    ],
)
def test_a_value_written_before_still_decodes_and_its_damage_is_found(
    kind: str, checksum: str
) -> None:
    fields = _header(encode_block(KEY, IDENTITY, PAYLOAD))
    del fields["crc32c"]
    fields[kind] = checksum
    header = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    value = b"GKVB\x01" + len(header).to_bytes(4, "big") + header + PAYLOAD
    decoded_whole = decode_block(value, KEY, IDENTITY)
    assert isinstance(decoded_whole, memoryview) and bytes(decoded_whole) == PAYLOAD
    damaged = value[:-1] + bytes([value[-1] ^ 1])
    decoded = decode_block(damaged, KEY, IDENTITY)
    assert isinstance(decoded, RejectedBlock) and "checksum" in decoded.reason


def test_a_checksum_fed_in_chunks_matches_the_whole() -> None:
    for kind in ("crc32c", "crc32", "sha256"):
        whole = PayloadCheck(kind, "")
        whole.update(PAYLOAD)
        parts = PayloadCheck(kind, whole.value())
        for start in range(0, len(PAYLOAD), 7):
            parts.update(PAYLOAD[start : start + 7])
        assert parts.matches()
