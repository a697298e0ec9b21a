"""The stored form: canonical, checksummed, and anything corrupt or foreign is a miss."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.domain.bundle import (
    Bundle,
    RejectedBundle,
    compile_bundle,
    decode_bundle,
    encode_bundle,
)
from graph_kvcache_mcp.domain.bundle.canonical import canonical_json, digest_hex
from tests.support.bundles import corpus, request

SECRET = b"bundle-secret-for-tests"


def sample() -> Bundle:
    return compile_bundle(request(corpus(20), "prefix cache", token_budget=800))


def reason_of(blob: bytes, key: str, secret: bytes | None = None) -> str:
    decoded = decode_bundle(blob, expected_key=key, secret=secret)
    assert isinstance(decoded, RejectedBundle)
    return decoded.reason


def test_a_bundle_round_trips_to_an_equal_bundle() -> None:
    bundle = sample()
    assert decode_bundle(encode_bundle(bundle), expected_key=bundle.key) == bundle


def test_encoding_is_canonical_json_with_format_and_checksum() -> None:
    bundle = sample()
    blob = encode_bundle(bundle)
    assert blob == encode_bundle(sample())
    envelope = json.loads(blob)
    assert envelope["format"] == "ctxbundle/1"
    assert envelope["checksum"].startswith("sha256:")
    assert (
        blob
        == json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    )


def test_scores_are_stored_as_integers_never_floats() -> None:
    payload = json.loads(encode_bundle(sample()))["payload"]

    def floats(value: object) -> list[float]:
        if isinstance(value, float):
            return [value]
        if isinstance(value, dict):
            return [f for v in value.values() for f in floats(v)]
        if isinstance(value, list):
            return [f for v in value for f in floats(v)]
        return []

    assert floats(payload) == []


def test_one_flipped_character_in_the_payload_is_a_checksum_miss() -> None:
    bundle = sample()
    blob = encode_bundle(bundle)
    target = bundle.items[0].text[:12].encode()
    tampered = blob.replace(target, target[:-1] + b"#", 1)
    assert tampered != blob
    assert "checksum" in reason_of(tampered, bundle.key)


@pytest.mark.parametrize(
    ("blob", "expected"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (b"[1, 2]", "not a bundle envelope"),
        (b'{"format": "ctxbundle/1"}', "not a bundle envelope"),
        (b'{"checksum": 1, "format": "ctxbundle/1", "payload": {}}', "not a bundle envelope"),
        (b'{"checksum": "sha256:00", "format": "ctxbundle/0", "payload": {}}', "format"),
        (b'{"checksum":"sha256:00","format":"ctxbundle/1","payload":{},"x":1}', "envelope"),
        (b'{"checksum": "sha256:00", "format": "ctxbundle/1", "payload": {}}', "checksum"),
    ],
)
def test_corrupt_entries_are_rejected_with_a_reason_never_raised(
    blob: bytes, expected: str
) -> None:
    assert expected in reason_of(blob, "ctxbundle:" + "0" * 64)


def envelope_around(payload: object) -> bytes:
    """A well-formed envelope with a correct checksum around any payload (a forger's view)."""
    return canonical_json(
        {
            "checksum": "sha256:" + digest_hex(canonical_json(payload)),
            "format": "ctxbundle/1",
            "payload": payload,
        }
    )


def test_a_valid_checksum_over_a_payload_of_the_wrong_shape_is_rejected() -> None:
    payload = {"key": "ctxbundle:x", "items": "not a list"}
    assert "not a ctxbundle/1 bundle" in reason_of(envelope_around(payload), "ctxbundle:x")


def test_a_payload_with_floats_where_integers_belong_is_rejected() -> None:
    payload = json.loads(encode_bundle(sample()))["payload"]
    payload["tokens_used"] = float(payload["tokens_used"])
    assert "not a ctxbundle/1 bundle" in reason_of(envelope_around(payload), payload["key"])


def test_an_entry_for_another_key_is_foreign() -> None:
    bundle = sample()
    assert "another key" in reason_of(encode_bundle(bundle), "ctxbundle:" + "f" * 64)


def test_signed_entries_need_the_secret_and_unsigned_ones_are_refused_when_it_is_set() -> None:
    bundle = compile_bundle(request(corpus(5)), secret=SECRET)
    signed = encode_bundle(bundle, secret=SECRET)
    assert json.loads(signed)["checksum"].startswith("hmac-sha256:")
    assert decode_bundle(signed, expected_key=bundle.key, secret=SECRET) == bundle
    assert "configure the bundle secret" in reason_of(signed, bundle.key)
    assert "checksum does not match" in reason_of(signed, bundle.key, secret=b"other")
    unsigned = encode_bundle(bundle)
    assert "not signed" in reason_of(unsigned, bundle.key, secret=SECRET)


def test_reasons_never_contain_the_secret() -> None:
    bundle = compile_bundle(request(corpus(2)), secret=SECRET)
    reason = reason_of(encode_bundle(bundle, secret=SECRET), bundle.key, secret=b"x" + SECRET)
    assert SECRET.decode() not in reason


@given(st.binary(max_size=2_000))
def test_arbitrary_bytes_never_raise(blob: bytes) -> None:
    assert isinstance(decode_bundle(blob, expected_key="ctxbundle:k"), RejectedBundle)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), st.lists, max_leaves=20))
def test_arbitrary_json_payloads_with_a_valid_checksum_never_raise(payload: object) -> None:
    blob = envelope_around({"data": payload})
    assert isinstance(decode_bundle(blob, expected_key="k"), RejectedBundle)
